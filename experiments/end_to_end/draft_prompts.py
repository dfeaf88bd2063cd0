"""The learned draft's training prompts: stage 1 of :mod:`experiments.end_to_end.train_draft`.

Prompts from text that is on this machine and is not the project's: Python functions and
documentation paragraphs of the installed packages (``site-packages``) and ``/usr/share/doc``,
wrapped in instruction templates (explain, summarize, comment, continue, answer a question about
a heading ...) as one user turn of the chat template, and everyday requests and tasks written
here (:data:`CHAT_TEMPLATES`, :data:`TASK_TEMPLATES`); or requests the target writes itself
(:data:`REQUEST_SAMPLING`: :func:`experiments.end_to_end.draft_data.write_requests`). The project's prompt sets
(:mod:`experiments.end_to_end.prompt_sets`) are the held-out evaluation: no template copies
their instructions and no text of theirs is used.

:func:`build_prompts` makes ``n`` prompts from one seed; :func:`prompt_chunk` is chunk ``c`` of the
prompts the target answers (``GEN_CHUNK`` of them) and :func:`document_chunk` chunk ``c`` of the
document chats (``DOC_CHUNK``: a user turn asking to continue a piece of a file, the assistant turn
the text that follows it there), each chunk from its own seed. :data:`PROMPTS_VERSION` is part of
the answers' cache key.
"""

from __future__ import annotations

import gzip
import os
import random
import re
import site
from pathlib import Path

from .. import paths

# Instruction templates. None of them repeats an instruction of the evaluation prompt sets.
CODE_TEMPLATES = [
    "Explain what this Python code does:\n```python\n{text}\n```",
    "What are the inputs and outputs of this function?\n```python\n{text}\n```",
    "Describe in plain English how this works:\n```python\n{text}\n```",
    "Write a short usage example for this function:\n```python\n{text}\n```",
    "Are there any bugs or edge cases in this code?\n```python\n{text}\n```",
    "Add comments to this code and show it again:\n```python\n{text}\n```",
]
TEXT_TEMPLATES = [
    "Summarize the following text:\n{text}",
    "Explain this to a beginner:\n{text}",
    "What is the main point of this passage?\n{text}",
    "Write three questions a reader might ask about this text:\n{text}",
    "Continue writing after this paragraph:\n{text}",
    "Make a bullet list of the key facts in this text:\n{text}",
]
TOPIC_TEMPLATES = [
    "What is {text}?",
    "Explain {text} in simple terms.",
    "Give me three tips about {text}.",
    "Write a short paragraph about {text}.",
    "Why would someone use {text}?",
    "Tell me a short story that involves {text}.",
]
# Everyday requests: what a chat assistant is mostly asked, and where its answers differ most from
# the prose and code of the files above. Subjects and templates are written here, not taken from any
# prompt set (held-out or benchmark).
CHAT_TEMPLATES = [
    "Give me five ideas related to {text}.",
    "Explain how {text} works, step by step.",
    "What are the pros and cons of {text}?",
    "Write a short speech about {text}.",
    "Describe {text} to someone who has never heard of it.",
    "What are common mistakes people make with {text}?",
    "Write a haiku about {text}.",
    "Write a product description for {text}.",
    "Write the opening paragraph of a blog post about {text}.",
    "Answer in one paragraph: why does {text} matter?",
    "Make a checklist for {text}.",
    "Write a motivational message about {text}.",
    "What should I know before I start with {text}?",
    "Tell me a fun fact about {text} and explain it.",
    "Compare {text} with {other} in a few sentences.",
    "Write a short conversation between two friends about {text}.",
    "Give me a one-week plan for getting better at {text}.",
    "What is the history of {text}, in brief?",
]
SUBJECTS = [
    "gardening", "a rainy weekend", "learning to swim", "coffee", "tea", "public libraries", "camping",
    "saving money", "a first job interview", "running a marathon", "houseplants", "volcanoes", "bread baking",
    "chess", "electric cars", "recycling", "birthday parties", "moving to a new city", "homework",
    "sleep", "breakfast", "snow", "thunderstorms", "the moon", "honey bees", "museums", "trains",
    "photography", "knitting", "video games", "board games", "soccer", "basketball", "yoga",
    "meditation", "time management", "public speaking", "writing a resume", "learning a language",
    "the piano", "guitar lessons", "a science fair", "recycling old phones", "solar panels", "wind power",
    "composting", "hiking boots", "dogs as pets", "goldfish", "birds in winter", "autumn leaves",
    "spring cleaning", "a road trip", "airports", "hotels", "street food", "spicy food", "vegetables",
    "drinking water", "vitamins", "a healthy lunch", "a budget for students", "credit cards",
    "online shopping", "passwords", "email etiquette", "social media", "smartphones", "laptops",
    "the internet", "printers", "spreadsheets", "a small bakery", "opening a cafe", "farmers",
    "forests", "deserts", "rivers", "mountains", "glaciers", "earthquakes", "the solar system",
    "telescopes", "dinosaurs", "ancient Egypt", "the printing press", "the telephone", "bicycle repair",
    "kites", "paper airplanes", "origami", "painting with watercolors", "a school play", "summer camp",
    "teamwork", "friendship", "kindness", "patience", "curiosity", "a new neighbor", "grandparents",
    "family dinners", "a wedding toast", "a thank-you note", "job feedback", "a lost wallet",
    "a flat tire", "fixing a leaky tap", "painting a room", "building a bookshelf", "a tiny house",
    "city parks", "public transport", "traffic", "clean air", "plastic bags", "ocean tides",
    "rainbows", "clouds", "fireflies", "ants", "owls", "elephants", "penguins", "sharks",
    "olive oil", "cheese", "chocolate", "rice", "soup", "sandwiches", "ice cream", "lemonade",
    "a lemonade stand", "a garage sale", "a job promotion", "working from home", "a daily walk",
    "stretching", "drawing comics", "poetry readings", "podcasts", "audiobooks", "newspapers",
    "maps", "compasses", "clocks", "calendars", "birthdays", "holidays", "fireworks", "lanterns",
]
TASK_TEMPLATES = [
    "Paraphrase this paragraph:\n{text}",
    "Give this text a title and a one-sentence description:\n{text}",
    "Turn this text into a list of short points:\n{text}",
    "Which three words matter most in the following text? Explain each:\n{text}",
    "Write a friendly reply to someone who sent you this:\n{text}",
    "Is this text formal or informal? Explain with an example:\n{text}",
    "List every name and number mentioned in this text:\n{text}",
    "Write a question about this text and answer it:\n{text}",
    "Shorten this text to one sentence:\n{text}",
    "Write a unit test for this function:\n```python\n{code}\n```",
    "Annotate the arguments of this function with types:\n```python\n{code}\n```",
    "Suggest a clearer name for this function and explain why:\n```python\n{code}\n```",
    "How could this function be made shorter? Give the new version:\n```python\n{code}\n```",
    "Sort these alphabetically, one per line:\n{items}",
    "Number these items and add a short note to each:\n{items}",
    "Group these into categories:\n{items}",
]


def _text_files(max_files: int, rng: random.Random):
    roots = [Path(p) for p in site.getsitepackages()] + [Path("/usr/share/doc")]
    repo = paths.REPO_ROOT.resolve()
    found = []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            if Path(dirpath).resolve().is_relative_to(repo):
                continue  # never the project's own text (an editable install points here)
            for name in names:
                if name.endswith((".py", ".md", ".rst", ".txt")) or name in ("README", "copyright") or name.endswith(".md.gz"):
                    found.append(Path(dirpath) / name)
    found.sort()
    rng.shuffle(found)
    return found[:max_files]


def _read(path: Path) -> str:
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        return raw[:200_000].decode("utf-8", "replace")
    except OSError:
        return ""


_DEF = re.compile(r"^(?:    )?def \w+\(.*?(?=^(?:    )?def |^class |\Z)", re.S | re.M)
_HEADING_MD = re.compile(r"^#{1,3} +([A-Za-z][\w .,'()-]{3,60})$", re.M)
_HEADING_RST = re.compile(r"^([A-Za-z][\w .,'()-]{3,60})\n[=\-~^]{4,}$", re.M)


def snippets(path: Path, text: str):
    """``(kind, text)`` pieces of one file: functions of a .py, paragraphs and headings of prose."""
    out = []
    if path.suffix == ".py":
        for m in _DEF.finditer(text):
            body = m.group(0).rstrip()
            if 120 <= len(body) <= 600 and body.count("\n") >= 3:
                out.append(("code", body))
    else:
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            letters = sum(c.isalpha() for c in para)
            if 200 <= len(para) <= 600 and letters > 0.7 * len(para):
                out.append(("text", para))
        for m in list(_HEADING_MD.finditer(text)) + list(_HEADING_RST.finditer(text)):
            title = m.group(1).strip()
            if len(title.split()) >= 2:
                out.append(("topic", title.lower()))
    return out


def build_prompts(n: int, seed: int, max_files: int = 6000):
    """``n`` user-turn prompts (strings) and the count of each source kind."""
    rng = random.Random(seed)
    pieces = {"code": [], "text": [], "topic": []}
    for path in _text_files(max_files, rng):
        for kind, text in snippets(path, _read(path)):
            pieces[kind].append(text)
    templates = {"code": CODE_TEMPLATES, "text": TEXT_TEMPLATES, "topic": TOPIC_TEMPLATES}
    kinds = [k for k in ("code", "text", "topic") if pieces[k]] + ["chat", "chat", "task", "task"]
    prompts, counts = [], {k: 0 for k in kinds}
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == "chat":
            subject, other = rng.sample(SUBJECTS, 2)
            prompts.append(rng.choice(CHAT_TEMPLATES).format(text=subject, other=other))
        elif kind == "task":
            prompts.append(_task_prompt(rng, pieces))
        else:
            prompts.append(rng.choice(templates[kind]).format(text=rng.choice(pieces[kind])))
        counts[kind] += 1
    return prompts, {"prompts": counts, "pieces": {k: len(v) for k, v in pieces.items()}}


def _task_prompt(rng: random.Random, pieces) -> str:
    """One of :data:`TASK_TEMPLATES`, filled with a prose piece, a function or a few subjects."""
    template = rng.choice(TASK_TEMPLATES)
    if "{code}" in template and not pieces["code"] or "{text}" in template and not pieces["text"]:
        template = TASK_TEMPLATES[-1]
    return template.format(text=rng.choice(pieces["text"]) if pieces["text"] else "",
                           code=rng.choice(pieces["code"]) if pieces["code"] else "",
                           items="\n".join(rng.sample(SUBJECTS, rng.randint(4, 8))))


#: Bumped when :func:`build_prompts` changes (part of the answers' cache key): 2 added the everyday
#: requests (``chat``) and tasks on texts, functions and lists (``task``), over half the prompts.
PROMPTS_VERSION = 2

# Chunks: chunk c of the answers draws its prompts with seed + CHUNK_SEED_STRIDE * c (chunk 0 with
# the seed itself), chunk c of the documents with the string "documents:<seed>:<c>".
GEN_CHUNK = 640
DOC_CHUNK = 512
CHUNK_SEED_STRIDE = 1_000_003
DOC_TEMPLATES = [
    "Continue this {kind}:\n{text}",
    "Here is the beginning of a {kind}. Write what comes next.\n{text}",
    "What comes after this {kind}?\n{text}",
]


#: Requests the target writes itself (Magpie, Xu et al. 2024): it continues its chat template up to
#: the user turn, ``<|im_start|>user\n``, sampled at this temperature and top-p (1.0 / 0.95: varied
#: requests, the far tail cut), for at most ``REQUEST_TOKENS`` tokens; a request is kept when it
#: ends with the turn's end token and has ``REQUEST_MIN_WORDS`` words or more (about one draw in
#: five runs on as a web page would, never closing the turn: dropped; 1,296 of 1,632 kept). Bump ``REQUESTS_VERSION`` when
#: these change (part of the requests' cache key).
REQUEST_SAMPLING = dict(temperature=1.0, top_p=0.95)
REQUEST_TOKENS = 64
REQUEST_MIN_WORDS = 4
REQUESTS_VERSION = 1
#: What a requests chunk's ``sources`` say (its prompts are made with the shards, by the target).
REQUEST_SOURCES = {"requests": "written by the target: its chat template up to the user turn, sampled at "
                               f"temperature {REQUEST_SAMPLING['temperature']}, top-p {REQUEST_SAMPLING['top_p']}, "
                               f"up to {REQUEST_TOKENS} tokens; kept when the turn ends and has >= {REQUEST_MIN_WORDS} words"}


def prompt_chunk(c: int, seed: int, max_files: int):
    """Chunk ``c`` of the prompts: ``GEN_CHUNK`` prompts sorted by length (batches of similar length
    pad little in ``generate``) and their sources."""
    prompts, sources = build_prompts(GEN_CHUNK, seed + CHUNK_SEED_STRIDE * c, max_files)
    return sorted(prompts, key=len), sources


def _lines_piece(lines, start: int, min_chars: int, max_chars: int):
    """Whole lines from ``start`` adding up to at most ``max_chars`` (None below ``min_chars``)."""
    out, size = [], 0
    for line in lines[start:]:
        if size + len(line) + 1 > max_chars:
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out).strip() if size >= min_chars else None


def document_chunk(c: int, seed: int, max_files: int):
    """Chunk ``c`` of the documents: ``DOC_CHUNK`` ``(user, assistant)`` turns, the user asking to
    continue a piece of a file (300-900 characters), the assistant turn the text that follows it
    there (400-1600 characters); half prose (up to three pieces a file: prose files are the fewer),
    half code, license files left out (the same few texts again and again); and the count of each."""
    rng = random.Random(f"documents:{seed}:{c}")
    files = [f for f in _text_files(max_files, rng) if f.name not in ("copyright", "LICENSE", "LICENSE.txt", "COPYING")]
    found = {"code": [], "text": []}
    for path in files:
        kind = "code" if path.suffix == ".py" else "text"
        if len(found[kind]) >= DOC_CHUNK // 2:
            if all(len(v) >= DOC_CHUNK // 2 for v in found.values()):
                break
            continue
        lines = _read(path).splitlines()
        for _ in range(1 if kind == "code" else 3):
            if len(lines) <= 20:
                break
            start = rng.randrange(0, len(lines) - 20)
            first = _lines_piece(lines, start, 300, 900)
            if first is None:
                continue
            second = _lines_piece(lines, start + first.count("\n") + 1, 400, 1600)
            if second is None or sum(ch.isalpha() for ch in first + second) < 0.4 * len(first + second):
                continue
            if kind == "code":
                first, second = f"```python\n{first}\n```", f"```python\n{second}\n```"
            name = "piece of Python code" if kind == "code" else "text"
            found[kind].append((rng.choice(DOC_TEMPLATES).format(kind=name, text=first), second))
    turns = [t for pair in zip(found["text"], found["code"]) for t in pair]
    rest = found["text"][len(found["code"]):] + found["code"][len(found["text"]):]
    turns = (turns + rest)[:DOC_CHUNK]
    counts = {k: sum(1 for t in turns if t in v) for k, v in found.items()}
    return turns, {"documents": counts, "files": len(files)}
