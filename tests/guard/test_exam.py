"""The exams (data/exam/) are read by their report alone: no tuning code, rule or test may open
them, so no rule, word or threshold can be fitted to them; and no tuning pair or test case may
share a template with an exam prompt (a prompt with a topic word changed is a copy)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAM = "exam/"  # the folder: the exams and GPTCache's benchmark, kept for the report alone
ALLOWED = {"bench/guard_exam.py", "tests/guard/test_exam.py", "tests/conftest.py"}  # conftest: the guard
EXAM_2 = ROOT / "data" / "exam" / "guard_exam_2.jsonl"  # the second exam, written blind
# the third, written blind before the learned decision (#47): 21 of its 320 pairs shared a
# template with a tuning file or a test and were dropped before any guard ran on it
EXAM_3 = ROOT / "data" / "exam" / "guard_exam_3.jsonl"
# the fourth, written blind before the pair model (#66): 9 of its 330 pairs shared a template with
# a tuning file, a test or the training data and were dropped before anything read it
EXAM_4 = ROOT / "data" / "exam" / "guard_exam_4.jsonl"
# the conversations' exam (pairs of chats), written blind for the context matcher
CONVERSATIONS = ROOT / "data" / "exam" / "conversations_exam.jsonl"
# the second, written blind when the first was spent (#48); pairs sharing a template with a
# tuning file or a test were dropped before the matcher ran on it
CONVERSATIONS_2 = ROOT / "data" / "exam" / "conversations_exam_2.jsonl"
# the third, written blind with the traps a shared key meets (#65): long templates before a
# record, requests that read alone, facts beside reaction words, other languages, instructions
# in turns; 25 of its 243 pairs shared a template with a tuning file or a test and were dropped
# before the matcher ran on it
CONVERSATIONS_3 = ROOT / "data" / "exam" / "conversations_exam_3.jsonl"


@pytest.fixture(autouse=True)
def exam_reads():
    """This module's checks read the exams: the tests' audit hook (conftest.py) lets them."""
    import conftest

    conftest.exam_reads_allowed = True
    yield conftest
    conftest.exam_reads_allowed = False


def test_any_other_open_of_an_exam_file_is_refused_however_its_path_was_built(exam_reads, tmp_path):
    exam_reads.exam_reads_allowed = False  # as everywhere else in the tests
    for path in (
        ROOT / "data" / ("ex" + "am") / "guard_exam_2.jsonl",
        str(ROOT / "data" / "tests" / ".." / "exam" / "guard_exam.jsonl"),
    ):
        with pytest.raises(PermissionError, match="read by their report alone"):
            open(path, encoding="utf-8")
    link = tmp_path.parent / "innocent.jsonl"  # a path with no trace of the folder's name
    link.unlink(missing_ok=True)
    link.symlink_to(EXAM_2)
    with pytest.raises(PermissionError):
        link.read_text()
    (tmp_path / "mine.jsonl").write_text("{}")  # every other file opens as ever
    assert (tmp_path / "mine.jsonl").read_text() == "{}"


def test_no_code_but_the_exam_report_opens_the_exam_folder():
    readers = set()
    for folder in ("gpucache", "bench", "scripts", "tests", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".toml", ".txt") and EXAM in path.read_text(errors="ignore"):
                readers.add(str(path.relative_to(ROOT)))
    assert readers <= ALLOWED, readers - ALLOWED


@pytest.mark.parametrize(
    "name", ["guard_exam.jsonl", "guard_exam_2.jsonl", "guard_exam_3.jsonl", "guard_exam_4.jsonl"]
)
def test_the_exams_are_well_formed_and_balanced(name):
    rows = [json.loads(line) for line in (ROOT / "data/exam" / name).read_text().splitlines()]
    assert {tuple(sorted(r)) for r in rows} == {("a", "b", "id", "kind", "label", "source")}
    assert len({r["id"] for r in rows}) == len(rows)
    labels = [r["label"] for r in rows]
    assert labels.count(0) >= 40 and labels.count(1) >= 40


def words(text: str) -> tuple[str, ...]:
    """A prompt as its words, case and punctuation aside: what a copy keeps."""
    return tuple(re.findall(r"[^\W_]+", text.casefold()))


def allowed_edits(n: int) -> int:
    """Words a prompt of ``n`` words may change and still be a copy of its template: one in a
    short prompt, one more for every four words past eight."""
    return 1 + max(0, n - 4) // 4


def word_distance(x: tuple[str, ...], y: tuple[str, ...], bound: int) -> int:
    """Levenshtein distance over words, stopping early past ``bound``."""
    previous = list(range(len(y) + 1))
    for i, wx in enumerate(x, 1):
        current = [i]
        for j, wy in enumerate(y, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (wx != wy)))
        if min(current) > bound:
            return bound + 1
        previous = current
    return previous[-1]


def same_template(x: tuple[str, ...], y: tuple[str, ...], most_edits: int | None = None) -> bool:
    """The same sentence frame with a few words changed (a topic, a name, a number; at most
    ``most_edits`` where given), or the same words; prompts under four words must be equal."""
    if x == y:
        return True
    n = min(len(x), len(y))
    if n < 4:
        return False
    bound = allowed_edits(n) if most_edits is None else min(allowed_edits(n), most_edits)
    if abs(len(x) - len(y)) > bound or len(set(x) & set(y)) < n - bound:
        return False
    return word_distance(x, y, bound) <= bound


def exam_prompts(path: Path = EXAM_2) -> list[tuple[str, ...]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [words(r[side]) for r in rows for side in ("a", "b")]


def exam_requests(path: Path) -> list[tuple[str, ...]]:
    """The last sentence of each guard exam prompt of several, where it has ``CONTAINED_EDITED``
    words or more: the request, which a tuning prompt can keep while it rewords the sentences
    before it (an exam's "My flat is tiny and ... Suggest three ways to store bikes indoors."
    held by a tuning prompt "We live in a small studio. Suggest 3 ways to store bikes indoors.").
    (Not the first: that is where the exams put their greetings, which are chat's stock
    phrases, not a template.)"""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    last = [re.split(r"(?<=[.?!])\s+", r[side].strip())[-1] for r in rows for side in ("a", "b")]
    whole = {words(r[side]) for r in rows for side in ("a", "b")}
    return [w for part in last if len(w := words(part)) >= CONTAINED_EDITED and w not in whole]


def guard_exam_copies(path: Path, others: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """A guard exam's prompts whose template ``others`` hold, whole or inside a longer prompt,
    and its requests (``exam_requests``) held with at most one word changed."""
    return shared_templates(exam_prompts(path), others) + shared_templates(
        exam_requests(path), others, most_edits=1
    )


def _literal(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with each ``{...}`` read as one word, so a prompt
    built around a placeholder is read whole, as a copy of its template would be."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else " x " for part in node.values)
    return None


def _json_strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_json_strings(k), *_json_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _json_strings(v)]
    return []


def strings_of(path: Path) -> list[str]:
    """Every string a file can hold a prompt in: a Python file's literals (f-strings included),
    a JSON or JSON-lines file's strings at any depth, a text file's lines and their comma-separated
    entries (the guard's word lists)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        nodes = list(ast.walk(ast.parse(text)))
        inside = {id(part) for n in nodes if isinstance(n, ast.JoinedStr) for part in n.values}
        return [s for n in nodes if id(n) not in inside and (s := _literal(n)) is not None]
    if path.suffix == ".json":
        return _json_strings(json.loads(text))
    if path.suffix == ".jsonl":
        return [s for line in text.splitlines() if line.strip() for s in _json_strings(json.loads(line))]
    lines = [line.split("#", 1)[0] for line in text.splitlines()]
    return lines + [entry for line in lines for entry in line.split(",")]


# Where a tuning pair or a test case can live: the data (every folder but the exams'), the
# tests, and the package's own data and word lists
FENCED = [
    ("data", ("*.jsonl", "*.json", "*.txt")),
    ("tests", ("*.py", "*.jsonl", "*.json", "*.txt")),
    ("gpucache", ("*.jsonl", "*.json", "*.txt")),
]


def fenced_files(root: Path = ROOT) -> list[Path]:
    found = {
        path for folder, patterns in FENCED for pattern in patterns for path in (root / folder).rglob(pattern)
    }
    return sorted(p for p in found if EXAM.rstrip("/") not in p.relative_to(root).parts[:2])


def tuning_and_test_prompts(root: Path = ROOT) -> dict[str, list[tuple[str, ...]]]:
    """Every string of four words or more in a fenced file (``FENCED``), by file."""
    return {
        str(path.relative_to(root)): [w for s in strings_of(path) if len(w := words(s)) >= 4]
        for path in fenced_files(root)
    }


# An exam prompt inside a longer one: of this many words or more, word for word; of
# ``CONTAINED_EDITED`` or more, with the edits a whole prompt may have (``allowed_edits``). Shorter
# frames ("how long does it take to ...", "what can I help you with") sit inside any long text
# with a word changed: they are English, not a template.
CONTAINED_MIN = 5
CONTAINED_EDITED = 8


def contains_template(e: tuple[str, ...], x: tuple[str, ...], most_edits: int | None = None) -> bool:
    """Whether some run of ``x``'s words is ``e``'s template (``same_template``): an exam prompt
    inside a longer prompt, after a wrapper sentence or before a suffix, is a copy too."""
    if len(e) < CONTAINED_MIN:
        return False
    bound = allowed_edits(len(e)) if len(e) >= CONTAINED_EDITED else 0
    bound = bound if most_edits is None else min(bound, most_edits)
    if len(set(e) & set(x)) < len(set(e)) - bound:
        return False
    for size in range(len(e) - bound, len(e) + bound + 1):
        for start in range(len(x) - size + 1):
            window = x[start : start + size]
            if window == e or (bound and same_template(e, window, bound)):
                return True
    return False


def shared_templates(
    exam: list[tuple[str, ...]],
    others: list[tuple[str, ...]],
    contained: bool = True,
    most_edits: int | None = None,
) -> list[tuple[str, ...]]:
    """The exam prompts whose template one of ``others`` has: as a whole prompt (a few words
    changed) or, with ``contained``, inside a longer one; ``most_edits`` caps the words changed.
    (A conversations' exam is read message by message without ``contained``: its turns are
    chat's stock phrases, "happy to help with that", which any long turn holds.)"""
    by_length: dict[int, list[tuple[str, ...]]] = {}
    holding: dict[str, set[int]] = {}  # word -> the longer prompts holding it, by index
    for i, x in enumerate(others):
        by_length.setdefault(len(x), []).append(x)
        for w in set(x):
            holding.setdefault(w, set()).add(i)
    hits = []
    for e in exam:
        spread = allowed_edits(len(e))
        near = (x for n in range(len(e) - spread, len(e) + spread + 1) for x in by_length.get(n, []))
        if any(same_template(e, x, most_edits) for x in near):
            hits.append(e)
            continue
        if not contained:
            continue
        # a prompt holding e's template misses at most ``spread`` of its distinct words, so it
        # holds one of its ``spread + 1`` rarest: only those prompts are read
        rarest = sorted(set(e), key=lambda w: len(holding.get(w, ())))[: spread + 1]
        longer = {i for w in rarest for i in holding.get(w, ()) if len(others[i]) > len(e) + spread}
        if any(contains_template(e, others[i], most_edits) for i in sorted(longer)):
            hits.append(e)
    return hits


def test_the_template_finder_finds_a_prompt_with_a_topic_word_changed():
    exam = [words("Which knot holds best on a wet nylon rope?")]
    assert shared_templates(exam, [words("which knot holds best on a wet hemp rope")])
    assert shared_templates(exam, [words("Which knot holds best on a wet climbing rope, please?")])
    assert not shared_templates(exam, [words("best knot for wet nylon rope")])
    assert not shared_templates([words("reset my password")], [words("reset my username")])


@pytest.mark.parametrize(
    "longer",
    [
        "Quick one before my meeting. Which knot holds best on a wet nylon rope?",
        "which knot holds best on a wet hemp rope and why does it slip less",
        "I was out sailing yesterday which knot holds best on a wet nylon rope thanks a lot",
    ],
    ids=["after a wrapper", "before a suffix", "inside both, a topic word changed"],
)
def test_the_template_finder_finds_a_prompt_inside_a_longer_one(longer):
    """A copy inside a longer prompt is a copy: the learned decision's blind tuning set once
    held an exam pair word for word after a wrapper sentence, and the fence did not see it."""
    exam = [words("Which knot holds best on a wet nylon rope?")]
    assert shared_templates(exam, [words(longer)])


def test_the_template_finder_does_not_call_shared_words_in_another_order_a_copy():
    exam = [words("Which knot holds best on a wet nylon rope?")]
    scattered = "A nylon rope that is wet: which of these holds best, and which knot is easiest to tie?"
    assert not shared_templates(exam, [words(scattered)])


NEAR_COPY = "Which knot holds best on a wet hemp rope?"  # a topic word changed


@pytest.mark.parametrize(
    "where, content",
    [
        (
            "tests/guard/test_x.py",
            "def test_x(material):\n    check(f'Which knot holds best on a wet {material} rope?')\n",
        ),
        ("tests/fixtures/cases/more.jsonl", json.dumps({"a": NEAR_COPY, "b": "a knot"}) + "\n"),
        ("data/extra/pairs.json", json.dumps({"pairs": [{"prompts": [NEAR_COPY, "a knot"]}]})),
        ("gpucache/guard/framing.txt", "# a word list\nhello there, " + NEAR_COPY + "\n"),
    ],
    ids=["f-string", "a subfolder", "json", "a word list"],
)
def test_the_fence_reads_every_place_a_copy_can_live(tmp_path, where, content):
    """A near-copy of an exam prompt (``Which knot holds best on a wet nylon rope?`` standing in
    for one) placed in each kind of file the fence reads is found there."""
    path = tmp_path / where
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8")
    exam = [words("Which knot holds best on a wet nylon rope?")]
    found = {w: shared_templates(exam, prompts) for w, prompts in tuning_and_test_prompts(tmp_path).items()}
    assert found == {where: exam}


# Found when the fence first read the package's data (it read data/*.jsonl and the tests' plain
# literals before): two generic question shapes of the demo workload, written two days before the
# second exam, which the exam's own check (11 pairs dropped) did not read. Recorded, not hidden:
# these two exam pairs (exam2:mixed:4, exam2:subtle-request:7) are not strictly out of sample
# (data/SOURCES.md says so); the exam is not edited after its report. Any other copy fails.
# (named by a digest of their words, so that no exam text is written here)
KNOWN_SHARED = {"gpucache/data/demo_workload.jsonl": {"e9c0fd35d0d8f540", "4052eda3f937c76b"}}
# Found when the fence first read inside longer prompts (#68): the pair model's blind training
# set holds two second-exam and two third-exam prompts inside longer ones (one a question shape of
# the demo workload's above). The pair model (v1) was trained on them and is examined on the
# fourth exam alone, which nothing of them touches; they leave the set before a v2 is trained.
# The twelve such rows of the learned decision's tuning set and the one of the chat set were
# removed (data/SOURCES.md).
KNOWN_CONTAINED = {
    EXAM_2: {"data/pair_model_tuning.jsonl": {"1cc037ddb01025be", "3bb0dd6807441d85", "4052eda3f937c76b"}},
    EXAM_3: {"data/pair_model_tuning.jsonl": {"b6bb78e5125462ed", "f0c6c0f48b1466a1"}},
    EXAM_4: {},
}


def digest(prompt: tuple[str, ...]) -> str:
    import hashlib

    return hashlib.blake2b(" ".join(prompt).encode(), digest_size=8).hexdigest()


def conversation_exam_messages(path: Path = CONVERSATIONS) -> list[tuple[str, ...]]:
    """Every message of every conversation of a conversations' exam, as its words."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [words(m["content"]) for r in rows for side in ("a", "b") for m in r[side]]


@pytest.mark.parametrize("path", [CONVERSATIONS, CONVERSATIONS_2, CONVERSATIONS_3], ids=lambda p: p.name)
def test_the_conversations_exams_are_well_formed_and_balanced(path):
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert {tuple(sorted(r)) for r in rows} == {
        ("a", "b", "domain", "final", "id", "kind", "label", "length")
    }
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        for side in (r["a"], r["b"]):
            assert side[-1]["role"] == "user" and all(
                m["role"] in ("system", "user", "assistant") for m in side
            )
    labels = [r["label"] for r in rows]
    assert labels.count(0) >= 80 and labels.count(1) >= 80


@pytest.mark.parametrize("path", [CONVERSATIONS, CONVERSATIONS_2, CONVERSATIONS_3], ids=lambda p: p.name)
def test_no_tuning_pair_or_test_case_shares_a_template_with_the_conversations_exams(path):
    """Every message of a conversations' exam, against every string of the tuning data and
    the tests: 17 of the first's 200 pairs were dropped before any report for sharing one (the
    tuning set's conversations and the older prompt sets among them), and of the second's 220
    as many as data/SOURCES.md says; any new copy fails here."""
    exam = conversation_exam_messages(path)
    copies = {
        where: len(shared_templates(exam, prompts, contained=False))
        for where, prompts in tuning_and_test_prompts().items()
    }
    assert {where: n for where, n in copies.items() if n} == {}


def test_no_tuning_pair_or_test_case_shares_a_template_with_the_exam():
    """The second exam's prompts against every string of the tuning data, the tests and the
    package's data, whole, inside a longer prompt, and its requests reworded around."""
    copies = {
        where: {digest(p) for p in guard_exam_copies(EXAM_2, prompts)}
        for where, prompts in tuning_and_test_prompts().items()
    }
    known = {**KNOWN_SHARED, **KNOWN_CONTAINED[EXAM_2]}
    assert {where: found for where, found in copies.items() if found} == known


def test_no_tuning_pair_or_test_case_shares_a_template_with_the_third_exam():
    """The third exam against every string of the tuning data (the learned decision's set
    among them), the tests and the package's data: none shares a template but those known."""
    copies = {
        where: {digest(p) for p in guard_exam_copies(EXAM_3, prompts)}
        for where, prompts in tuning_and_test_prompts().items()
    }
    assert {where: found for where, found in copies.items() if found} == KNOWN_CONTAINED[EXAM_3]


def test_no_tuning_pair_training_pair_or_test_case_shares_a_template_with_the_fourth_exam():
    """The fourth exam against every string of the tuning data (the pair model's written set
    among them), the tests, the package's data and the pair model's public training data
    (../shared/data/train: PAWS-Wiki's dev pairs, the intent queries): none shares a template."""
    copies = {
        where: len(guard_exam_copies(EXAM_4, prompts)) for where, prompts in tuning_and_test_prompts().items()
    }
    train = ROOT.parent / "shared" / "data" / "train"
    for path in sorted(train.glob("*.jsonl")) if train.is_dir() else []:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        prompts = [w for r in rows for k in ("a", "b", "text") if k in r and len(w := words(r[k])) >= 4]
        copies[path.name] = len(guard_exam_copies(EXAM_4, prompts))
    assert {where: n for where, n in copies.items() if n} == {}
