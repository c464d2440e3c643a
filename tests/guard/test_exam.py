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


@pytest.fixture(autouse=True)
def exam_reads():
    """This module's checks read the exams: the tests' audit hook (conftest.py) lets them."""
    import conftest

    conftest.exam_reads_allowed = True
    yield conftest
    conftest.exam_reads_allowed = False


def test_any_other_open_of_an_exam_file_is_refused_however_its_path_was_built(exam_reads, tmp_path):
    exam_reads.exam_reads_allowed = False  # as everywhere else in the tests
    for path in (ROOT / "data" / ("ex" + "am") / "guard_exam_2.jsonl",
                 str(ROOT / "data" / "tests" / ".." / "exam" / "guard_exam.jsonl")):
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
    for folder in ("gpucache", "bench", "scripts", "tests", "kernels", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".toml", ".txt") and EXAM in path.read_text(errors="ignore"):
                readers.add(str(path.relative_to(ROOT)))
    assert readers <= ALLOWED, readers - ALLOWED


@pytest.mark.parametrize("name", ["guard_exam.jsonl", "guard_exam_2.jsonl"])
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


def same_template(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
    """The same sentence frame with a few words changed (a topic, a name, a number), or the
    same words; prompts under four words must be equal."""
    if x == y:
        return True
    n = min(len(x), len(y))
    if n < 4:
        return False
    bound = allowed_edits(n)
    if abs(len(x) - len(y)) > bound or len(set(x) & set(y)) < n - bound:
        return False
    return word_distance(x, y, bound) <= bound


def exam_prompts() -> list[tuple[str, ...]]:
    rows = [json.loads(line) for line in EXAM_2.read_text(encoding="utf-8").splitlines()]
    return [words(r[side]) for r in rows for side in ("a", "b")]


def tuning_and_test_prompts() -> dict[str, list[tuple[str, ...]]]:
    """Every prompt of a tuning file (data/*.jsonl, all read by tuning code) and every string
    of four words or more written in a test."""
    found: dict[str, list[tuple[str, ...]]] = {}
    for path in sorted((ROOT / "data").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            found.setdefault(path.name, []).extend([words(row["a"]), words(row["b"])])
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        found[str(path.relative_to(ROOT))] = [w for s in strings if len(w := words(s)) >= 4]
    return found


def shared_templates(exam: list[tuple[str, ...]], others: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    by_length: dict[int, list[tuple[str, ...]]] = {}
    for x in others:
        by_length.setdefault(len(x), []).append(x)
    hits = []
    for e in exam:
        spread = allowed_edits(len(e))
        near = (x for n in range(len(e) - spread, len(e) + spread + 1) for x in by_length.get(n, []))
        if any(same_template(e, x) for x in near):
            hits.append(e)
    return hits


def test_the_template_finder_finds_a_prompt_with_a_topic_word_changed():
    exam = [words("Which knot holds best on a wet nylon rope?")]
    assert shared_templates(exam, [words("which knot holds best on a wet hemp rope")])
    assert shared_templates(exam, [words("Which knot holds best on a wet climbing rope, please?")])
    assert not shared_templates(exam, [words("best knot for wet nylon rope")])
    assert not shared_templates([words("reset my password")], [words("reset my username")])


def test_no_tuning_pair_or_test_case_shares_a_template_with_the_exam():
    exam = exam_prompts()
    copies = {where: [" ".join(p) for p in shared_templates(exam, prompts)]
              for where, prompts in tuning_and_test_prompts().items()}
    assert {where: found for where, found in copies.items() if found} == {}
