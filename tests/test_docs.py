"""The built docs render: the landing page and an API page open in headless Chromium with content.

Needs the HTML build (``python -m sphinx -W --keep-going -n -b html docs docs/_build/html``) and
Debian's ``chromium``. Outside CI a missing build or browser skips these tests (with the command
that fixes it); in CI (``CI=true``) it fails them, so the check can never silently go missing.
``SPECVERIFY_DOCS_HTML`` points at another build directory.

Checks: each page's screenshot is not blank (many non-background pixels, several colours), its
DOM after the scripts ran holds the page's own text, and the search page, given a query, lists
the API page from the search index (so ``searchindex.js`` is present, loads and is complete
enough to find a documented function); every internal link and anchor of the build resolves; the
notebooks are rendered with their outputs; every public module of the package has its entry in
the API reference, and every name the documented packages export (``specverify``,
``specverify.law``, ``specverify.testing``) has one. Each check is shown to reject a broken case.
"""

import importlib
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = Path(os.environ.get("SPECVERIFY_DOCS_HTML", ROOT / "docs" / "_build" / "html"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
API_PAGE = Path("api") / "generated" / "specverify.accept.html"
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", "--window-size=1280,1000"]


def unavailable(what, fix):
    if IN_CI:
        pytest.fail(f"{what} is missing in CI: {fix}")
    pytest.skip(f"{what} is missing: {fix}")


@pytest.fixture(scope="module")
def html():
    if not (HTML / "index.html").is_file():
        unavailable(f"the docs build ({HTML})", "python -m sphinx -W --keep-going -n -b html docs docs/_build/html")
    return HTML


@pytest.fixture(scope="module")
def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    unavailable("chromium", "apt-get update && apt-get install -y chromium")


def run_browser(chromium, *args, timeout=120):
    """Run one headless Chromium command in a fresh profile; return its stdout."""
    with tempfile.TemporaryDirectory(prefix="specverify-chromium-") as profile:
        done = subprocess.run([chromium, *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"chromium exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def screenshot(chromium, url, out):
    run_browser(chromium, f"--screenshot={out}", "--virtual-time-budget=5000", url)
    from PIL import Image

    with Image.open(out) as image:
        return image.convert("RGB").copy()


def assert_not_blank(image, name):
    """Most of a page is background; text, code and images must make up a visible share."""
    import numpy as np

    pixels = np.asarray(image.resize((320, 250)), dtype=np.int16).reshape(-1, 3)   # [n, 3] RGB
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    background = colours[counts.argmax()]
    differing = int((np.abs(pixels - background).max(axis=1) > 40).sum())
    assert differing > 0.02 * len(pixels), f"{name}: only {differing} of {len(pixels)} pixels differ from the background"
    assert len(colours) > 20, f"{name}: {len(colours)} colours, a blank or error page"


def dom(chromium, url):
    return run_browser(chromium, "--dump-dom", "--virtual-time-budget=10000", url)


def test_build_complete(html):
    for page in ("index.html", "search.html", "searchindex.js", "genindex.html", "py-modindex.html", str(API_PAGE),
                 "api/verify.html", "api/law.html", "api/reference.html", "api/decoding.html", "api/testing.html",
                 "api/integrations.html", "api/hub.html", "law.html", "performance.html", "guide/verification.html",
                 "guide/testing.html"):
        assert (html / page).is_file(), f"{page} missing from {html}"
    notebooks = sorted((html / "notebooks").glob("*.html"))
    assert len(notebooks) == len(list((ROOT / "notebooks").glob("*.ipynb"))), notebooks
    index = (html / "searchindex.js").read_text()
    for name in ("accept_block", "verify_greedy", "speculativedecoder"):
        assert name in index.lower(), f"{name} not in the search index"


class _Links(HTMLParser):
    """Collects a page's ids and the (attribute, value) of every href and src."""

    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            elif name in ("href", "src") and value:
                self.links.append(value)


def parse(page):
    parser = _Links()
    parser.feed(page.read_text(errors="replace"))
    return parser


def internal_link_errors(html):
    """Every relative href/src of every built page points at a file that exists, and every
    #fragment at an id on the page it names; external links (http, mailto, ...) are not followed."""
    # _static holds the theme's own files (Jinja templates among them), not built pages.
    pages = {p: parse(p) for p in html.rglob("*.html") if "_static" not in p.relative_to(html).parts}
    errors = []
    for page, parsed in pages.items():
        for link in parsed.links:
            target = urlsplit(link)
            if target.scheme or target.netloc or link.startswith("//"):
                continue
            path = (page.parent / unquote(target.path)).resolve() if target.path else page
            if path.is_dir():
                path = path / "index.html"
            if not path.exists():
                errors.append(f"{page.relative_to(html)}: {link} (no {path})")
            elif target.fragment and path.suffix == ".html":
                ids = pages[path].ids if path in pages else parse(path).ids
                if unquote(target.fragment) not in ids:
                    errors.append(f"{page.relative_to(html)}: {link} (no id {target.fragment!r})")
    return errors


def test_internal_links(html):
    errors = internal_link_errors(html)
    assert not errors, f"{len(errors)} broken internal links:\n" + "\n".join(errors[:40])


def test_link_check_catches_broken_links(tmp_path):
    """Power: a missing page and a missing anchor are both reported."""
    (tmp_path / "a.html").write_text('<a href="b.html#here">b</a><a href="c.html">c</a><a href="#top">t</a>'
                                     '<a href="https://example.org/x">x</a><p id="top"></p>')
    (tmp_path / "b.html").write_text('<p id="elsewhere"></p>')
    errors = internal_link_errors(tmp_path)
    assert len(errors) == 2 and "no id 'here'" in errors[0] + errors[1] and any("c.html" in e for e in errors)


def test_notebooks_rendered_with_outputs(html):
    """The notebooks are committed without outputs; their pages must show the executed ones."""
    page = (html / "notebooks" / "01_analytic_law.html").read_text()
    assert "cell_output" in page, "no cell outputs on the rendered notebook"
    assert re.search(r'<img[^>]+src="[^"]+\.png"', page), "no figure on the rendered notebook"


@pytest.mark.parametrize("page, must_contain", [
    ("index.html", ["verification step of speculative decoding", "Getting started"]),
    (str(API_PAGE), ["specverify.accept", "target_probs", "Raises"]),
])
def test_page_renders(html, chromium, tmp_path, page, must_contain):
    url = (html / page).as_uri()
    image = screenshot(chromium, url, tmp_path / "shot.png")
    assert image.size == (1280, 1000)
    assert_not_blank(image, page)
    text = dom(chromium, url)
    for needle in must_contain:
        assert needle in text, f"{page}: {needle!r} not in the rendered DOM"
    # The theme's scripts ran: pydata-sphinx-theme's navigation is built in the DOM.
    assert "bd-sidebar" in text or "bd-header" in text


def test_search_finds_api_page(html, chromium):
    text = dom(chromium, (html / "search.html").as_uri() + "?q=accept_block")
    assert "specverify.accept_block" in text, "the search page did not list accept_block from the index"
    # Power: a query that matches nothing lists no API page, so the check above reads the results.
    text = dom(chromium, (html / "search.html").as_uri() + "?q=qqzzxxnomatch")
    assert "specverify.accept_block" not in text


def test_blank_pages_are_rejected(chromium, tmp_path):
    """Power of the screenshot check: an empty page and a one-line error page fail it."""
    for name, body in [("empty", ""), ("error", "<h1>404 Not Found</h1>")]:
        page = tmp_path / f"{name}.html"
        page.write_text(f"<!doctype html><html><body>{body}</body></html>")
        image = screenshot(chromium, page.as_uri(), tmp_path / f"{name}.png")
        with pytest.raises(AssertionError):
            assert_not_blank(image, name)


# -- The API reference covers the package ------------------------------------------------------------
# The packages whose page documents every name of their __all__ (docs/conf.py, PACKAGE_PAGES).
EXPORTING_PACKAGES = ("specverify", "specverify.law", "specverify.testing", "specverify.integrations.transformers")


def public_modules(package_dir=ROOT / "specverify", package="specverify"):
    """Dotted names of the package's public modules, from its files: no ``_``-prefixed part (which
    also leaves out ``__main__``), no module whose import gives another module object, and no
    module shadowed by a function of the same name in its package (``law.speedup``: the name is
    the function's, the module cannot have an entry of its own)."""
    names = []
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):
            continue
        name = ".".join(parts)
        module = importlib.import_module(name)
        if module.__name__ != name:
            continue   # not a module of its own name
        if len(parts) > 1 and getattr(importlib.import_module(".".join(parts[:-1])), parts[-1], module) is not module:
            continue
        names.append(name)
    return names


def entry_ids(html):
    """Every id of the API pages (module entries are ``module-<name>``, objects their full name)."""
    ids = set()
    for page in (html / "api").rglob("*.html"):
        ids |= parse(page).ids
    return ids


def missing_modules(ids, modules):
    return [name for name in modules if f"module-{name}" not in ids]


def missing_exports(ids, packages):
    """``package.name`` for each exported name with no entry, neither under the package nor (a
    constant, documented where it is assigned) under one of its submodules."""
    missing = []
    for package in packages:
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            if name.startswith("_") or isinstance(getattr(module, name, None), type(module)):
                continue   # a submodule: covered by the module check
            if f"{package}.{name}" in ids:
                continue
            if not hasattr(getattr(module, name, None), "__qualname__") and any(
                    i.startswith(package + ".") and i.endswith("." + name) for i in ids):
                continue
            missing.append(f"{package}.{name}")
    return missing


def test_every_public_module_documented(html):
    modules = public_modules()
    assert {"specverify.testing", "specverify.testing.exact", "specverify.verify.batch"} <= set(modules)
    missing = missing_modules(entry_ids(html), modules)
    assert not missing, f"public modules with no entry in the API reference (add them to docs/api/): {missing}"


def test_every_export_documented(html):
    missing = missing_exports(entry_ids(html), EXPORTING_PACKAGES)
    assert not missing, f"exported names with no entry in the API reference: {missing}"


def test_coverage_checks_catch_missing_entries():
    """Power: a module and an exported name without an entry are both reported."""
    modules = public_modules()
    ids = {f"module-{name}" for name in modules if name != "specverify.testing.broken"}
    assert missing_modules(ids, modules) == ["specverify.testing.broken"]
    testing = importlib.import_module("specverify.testing")
    ids = {f"specverify.testing.{name}" for name in testing.__all__ if name != "check_sampled"}
    assert missing_exports(ids, ["specverify.testing"]) == ["specverify.testing.check_sampled"]
