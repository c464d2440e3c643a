"""The frozen exam (data/exam/) is read by its report alone: no tuning code, rule or test may
open it, so no rule, word or threshold can be fitted to it."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAM = "exam/"  # the folder: the exam and GPTCache's benchmark, kept for the report alone
ALLOWED = {"bench/guard_exam.py", "tests/guard/test_exam.py"}


def test_no_code_but_the_exam_report_opens_the_exam_folder():
    readers = set()
    for folder in ("gpucache", "bench", "scripts", "tests", "kernels", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".toml", ".txt") and EXAM in path.read_text(errors="ignore"):
                readers.add(str(path.relative_to(ROOT)))
    assert readers <= ALLOWED, readers - ALLOWED


def test_the_exam_is_well_formed_and_balanced():
    rows = [json.loads(line) for line in (ROOT / "data/exam/guard_exam.jsonl").read_text().splitlines()]
    assert {tuple(sorted(r)) for r in rows} == {("a", "b", "id", "kind", "label", "source")}
    assert len({r["id"] for r in rows}) == len(rows)
    labels = [r["label"] for r in rows]
    assert labels.count(0) >= 40 and labels.count(1) >= 40
