"""The Hugging Face ``kernels`` repository written by ``python -m specverify.integrations.hub build``.

Sections: layout and metadata; loading offline with ``kernels.get_local_kernel`` and with
``LOCAL_KERNELS`` + the seed's ``get_kernel(..., version=1, trust_remote_code=True)`` (network
calls fail the test); the loaded kernel gives the package's own results, bit for bit; the seed's
usage snippet in a fresh interpreter where ``import specverify`` is blocked (the build is
self-contained).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
kernels = pytest.importorskip("kernels")

import specverify as sv  # noqa: E402
from specverify.integrations import hub  # noqa: E402

REPO_ID = hub.HUB_REPO_ID  # "phanerozoic/spec-verify", the seed's repository id
PUBLIC = ["verify_greedy", "accept", "accept_from_uniforms", "SpeculativeDecoder", "law", "reference"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("hub") / "spec-verify"
    assert hub.main(["build", "--out", str(out), "--arch"]) == 0
    return out


def go_offline(mp):
    """HF_HUB_OFFLINE for kernels, and any attempt to open a network connection fails the test."""
    from huggingface_hub import constants

    def no_network(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setattr(constants, "HF_HUB_OFFLINE", True)  # kernels reads it at call time
    mp.setattr(socket.socket, "connect", no_network)
    mp.setattr(socket, "create_connection", no_network)


@pytest.fixture
def offline(monkeypatch):
    go_offline(monkeypatch)


def cases(seed, n=20):
    """(target [K+1, V], draft [K, V], tokens [K]) float32 cases, tokens drawn from the draft."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k, v = int(rng.integers(1, 7)), int(rng.integers(2, 300))
        target = rng.dirichlet(np.full(v, 0.3), size=k + 1).astype(np.float32)
        draft = rng.dirichlet(np.full(v, 0.3), size=k).astype(np.float32)
        tokens = np.array([rng.choice(v, p=row / row.sum()) for row in draft.astype(np.float64)])
        out.append((torch.from_numpy(target), torch.from_numpy(draft), torch.from_numpy(tokens)))
    return out


# ------------------------------------------------------------------------------------------
# layout and metadata
# ------------------------------------------------------------------------------------------
def test_layout_and_metadata(built):
    from kernels._rust import Metadata

    variants = sorted(p.name for p in (built / "build").iterdir())
    assert set(hub.NOARCH_VARIANTS) <= set(variants)
    assert hub.arch_variant() in variants and len(variants) == 3
    digest = hub.content_hash()
    ids = set()
    for variant in variants:
        vdir = built / "build" / variant
        meta = json.loads((vdir / "metadata.json").read_text())
        assert meta["name"] == "spec-verify" and meta["version"] == 1 and isinstance(meta["version"], int)
        assert meta["python-depends"] == [] and meta["backend"] == {"type": "cpu"} and meta["license"]
        assert digest[:12] in meta["id"] and "." not in meta["id"] and "-" not in meta["id"]
        ids.add(meta["id"])
        parsed = Metadata.read_from_file(vdir / "metadata.json")  # what kernels itself reads
        assert parsed.id == meta["id"] and parsed.name.python_name == "spec_verify"
        pkg = vdir / "spec_verify"
        files = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file())
        assert files == [p.as_posix() for p in hub.package_files()]
        assert any(f.startswith("kernels/_kernels.") and not f.endswith(".py") for f in files)
        assert "hub.py" not in files and "integrations/hub.py" not in files and not any(f.endswith((".pyx", ".c", ".pyc")) for f in files)
    assert len(ids) == len(variants)  # one id per variant, all carrying the content hash


def test_package_imports_itself_relatively():
    # The kernel is registered under its metadata id: `import specverify` inside it would reach
    # an installed copy (or fail without one). Docstring examples do not count.
    assert hub.absolute_self_imports() == []


def test_build_refuses_absolute_self_import_and_missing_extension(tmp_path):
    pkg = tmp_path / "specverify"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""import specverify as sv  (docstring: fine)"""\nfrom . import ops\n')
    (pkg / "ops.py").write_text("def f():\n    import specverify.law as law\n    return law\n")
    with pytest.raises(hub.HubBuildError, match="_kernels"):
        hub.build(tmp_path / "out", package_dir=pkg)
    (pkg / ("_kernels" + hub.importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"")
    assert hub.absolute_self_imports(pkg) == [("ops.py", 2, "import specverify.law as law")]
    with pytest.raises(hub.HubBuildError, match=r"ops.py:2"):
        hub.build(tmp_path / "out", package_dir=pkg)
    assert not (tmp_path / "out").exists()


def test_content_hash_tracks_content(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    h1 = hub.content_hash(pkg)
    (pkg / "a.py").write_text("x = 2\n")
    assert hub.content_hash(pkg) != h1


# ------------------------------------------------------------------------------------------
# loading offline, both ways
# ------------------------------------------------------------------------------------------
def assert_is_hub_copy(mod, root):
    assert Path(mod.__file__).resolve().is_relative_to(root.resolve())
    assert Path(mod.kernels._kernels.__file__).resolve().is_relative_to(root.resolve())  # the copied .so
    assert mod is not sv and mod.__name__.startswith("spec_verify_")
    for name in PUBLIC:
        assert getattr(mod, name) is not None, name
    assert mod.SpeculativeDecoder.__module__ == mod.__name__ + ".decoding.decoder"


@pytest.mark.parametrize("backend", [None, "cpu"])
def test_get_local_kernel(built, offline, backend):
    mod = kernels.get_local_kernel(built, backend=backend)
    assert_is_hub_copy(mod, built)
    # the torch-version/CPU/OS-pinned variant is preferred when present and matching
    assert Path(mod.__file__).parent.parent.name == hub.arch_variant()


def test_get_local_kernel_each_variant(built, offline):
    for variant in hub.NOARCH_VARIANTS:
        root = built / "build" / variant
        mod = kernels.get_local_kernel(root)  # a path pointing directly at a variant
        assert_is_hub_copy(mod, root)
        assert mod.__name__ == json.loads((root / "metadata.json").read_text())["id"]


def test_variant_resolution_cpu_and_cuda_torch(built):
    # How kernels ranks the variants written (its own resolver, with explicit system parameters):
    # a CPU torch takes the pinned arch variant, then torch-cpu; a CUDA build of torch rejects
    # torch-cpu and the arch variant and falls back to torch-universal.
    from packaging.version import Version

    from kernels import variants as kv
    from kernels.backends import CPU, CUDA

    found = kv.get_variants_local(built / "build")
    system = dict(cpu="x86_64", os="linux", torch_version=Version("2.13"), torch_cxx11_abi=True,
                  tvm_ffi_version=None)
    arch = "torch213-cxx11-cpu-x86_64-linux"
    found = [v for v in found if v.variant_str in hub.NOARCH_VARIANTS] + [kv.parse_variant(arch)]
    cpu, _ = kv._resolve_variant_for_system(found, selected_backend=CPU(), **system)
    assert [v.variant_str for v in cpu] == [arch, "torch-cpu", "torch-universal"]
    cuda, _ = kv._resolve_variant_for_system(found, selected_backend=CUDA(version=Version("12.8")), **system)
    assert [v.variant_str for v in cuda] == ["torch-universal"]


def test_local_kernels_env_and_seed_call(built, offline, monkeypatch):
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={built}")
    mod = kernels.get_kernel(REPO_ID, version=1, trust_remote_code=True)
    assert_is_hub_copy(mod, built)


# ------------------------------------------------------------------------------------------
# the loaded kernel gives the package's own results
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loaded(built):
    # torch-cpu and torch-universal loaded side by side (two copies of the extension in one
    # process), plus the default resolution.
    with pytest.MonkeyPatch.context() as mp:
        go_offline(mp)
        return [kernels.get_local_kernel(built / "build" / v) for v in hub.NOARCH_VARIANTS] + [
            kernels.get_local_kernel(built)]


def test_verify_greedy_matches_package(loaded):
    for target, _, tokens in cases(1):
        want = sv.verify_greedy(target, tokens)
        for mod in loaded:
            assert mod.verify_greedy(target, tokens) == want


def test_accept_from_uniforms_matches_package(loaded):
    rng = np.random.default_rng(2)
    for target, draft, tokens in cases(3):
        u = rng.random(tokens.numel() + 1)
        for d in (draft, None):
            want = sv.accept_from_uniforms(target, d, tokens, u)
            for mod in loaded:
                assert mod.accept_from_uniforms(target, d, tokens, u) == want


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_accept_seeded_matches_package(loaded, kind):
    def gen(seed):
        return torch.Generator().manual_seed(seed) if kind == "torch" else np.random.default_rng(seed)

    for seed, (target, draft, tokens) in enumerate(cases(4)):
        want = [sv.accept(target, draft, tokens, generator=g) for g in [gen(seed)] for _ in range(5)]
        for mod in loaded:
            g = gen(seed)
            assert [mod.accept(target, draft, tokens, generator=g) for _ in range(5)] == want


def test_law_matches_package(loaded):
    target, draft, _ = cases(5, n=1)[0]
    a = sv.law.acceptance_rates(target, draft)
    for mod in loaded:
        np.testing.assert_array_equal(mod.law.acceptance_rates(target, draft), a)
        np.testing.assert_array_equal(mod.law.accepted_length_pmf(a), sv.law.accepted_length_pmf(a))


# ------------------------------------------------------------------------------------------
# the seed's usage snippet, in a fresh interpreter, with `import specverify` blocked
# ------------------------------------------------------------------------------------------
SEED_SNIPPET = '''
import json, sys

class _NoSpecverify:  # the build must not reach the installed package
    def find_spec(self, name, path=None, target=None):
        if name == "specverify" or name.startswith("specverify."):
            raise ImportError("specverify is blocked: " + name)
sys.meta_path.insert(0, _NoSpecverify())

import numpy as np
import torch

# a bigram target and a mismatched bigram draft over V = 16 tokens
rng = np.random.default_rng(0)
V = 16
T = torch.tensor(rng.dirichlet(np.full(V, 0.5), size=V), dtype=torch.float32)
D = 0.5 * T + 0.5 * torch.tensor(rng.dirichlet(np.full(V, 0.5), size=V), dtype=torch.float32)

def draft_step(prefix, k):
    toks, probs, last = [], [], int(prefix[-1])
    for _ in range(k):
        row = D[last]
        last = int(torch.argmax(row))
        toks.append(last); probs.append(row)
    return toks, torch.stack(probs)

def target_step(prefix, proposed):
    seq = [int(prefix[-1])] + [int(t) for t in proposed]
    return T[seq]

prompt_ids = torch.tensor([3, 1, 4])
target_probs = T[[3, 1, 4, 1, 5]]
draft_tokens = torch.tensor([1, 4, 2, 5])

# ---- the seed's usage snippet, as written ----
from kernels import get_kernel

sv = get_kernel("phanerozoic/spec-verify", version=1, trust_remote_code=True)

n_accepted, next_token = sv.verify_greedy(target_probs, draft_tokens)

dec = sv.SpeculativeDecoder(draft_step, target_step, k=4, greedy=True)
out = dec.generate(prompt_ids, max_new=128)
# ----------------------------------------------

plain = prompt_ids.tolist()  # plain greedy decoding of the target
while len(plain) < 3 + 128:
    plain.append(int(torch.argmax(T[plain[-1]])))
print(json.dumps({"name": sv.__name__, "verify_greedy": [n_accepted, next_token],
                  "out": out.tolist(), "plain": plain, "rounds": dec.stats.rounds,
                  "specverify_imported": "specverify" in sys.modules}))
'''


def test_seed_usage_snippet_offline_self_contained(built, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", LOCAL_KERNELS=f"{REPO_ID}={built}",
               HF_HOME=str(tmp_path / "hf"))  # an empty cache: only the local build can answer
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", SEED_SNIPPET], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["name"].startswith("spec_verify_") and not res["specverify_imported"]
    assert res["out"] == res["plain"] and len(res["out"]) == 3 + 128 and res["rounds"] < 128
    rng = np.random.default_rng(0)
    T = torch.tensor(rng.dirichlet(np.full(16, 0.5), size=16), dtype=torch.float32)
    assert res["verify_greedy"] == list(sv.verify_greedy(T[[3, 1, 4, 1, 5]], torch.tensor([1, 4, 2, 5])))


def test_cli_help():
    proc = subprocess.run([sys.executable, "-m", "specverify.integrations.hub", "build", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--out" in proc.stdout
