"""Every committed report says what produced it: the commit its figures were run at, near its
top, where a reader looks first; and the scripts label a run from the run itself
(bench/provenance.py), never with a fixed string a machine may not have run."""

from __future__ import annotations

import re
from pathlib import Path

import provenance

REPORTS = Path(__file__).resolve().parents[2] / "bench" / "reports"
COMMIT = re.compile(r"\b[Cc]ommit `?[0-9a-f]{7,40}\b")
NOTES = "performance-notes.md"  # many runs, each group naming the commit of the code it measured


def test_every_report_names_the_commit_it_was_run_at():
    unlabelled = [
        p.name
        for p in sorted(REPORTS.glob("*.md"))
        if p.name != NOTES and not COMMIT.search("\n".join(p.read_text(encoding="utf-8").splitlines()[:12]))
    ]
    assert unlabelled == []
    notes = (REPORTS / NOTES).read_text(encoding="utf-8").split("\n## ")[1:]
    assert notes and all(re.search(r"\b[0-9a-f]{7}\b", group) for group in notes)


def test_a_run_is_labelled_with_its_commit_machine_and_stack():
    text = provenance.run_label()
    assert re.match(r"commit [0-9a-f]{7,40}(\+changes)?, ", text)
    assert provenance.cpu_model() in text and "CPU threads, torch " in text and "Python 3." in text


class _Embedder:  # the two attributes a precision is read from
    def __init__(self, dtype, autocast_dtype):
        self.dtype, self.autocast_dtype = dtype, autocast_dtype


def test_the_precision_is_read_from_the_embedder_as_it_runs():
    import torch

    assert provenance.precision(_Embedder(torch.float32, None)) == "float32 matmuls"
    assert (
        provenance.precision(_Embedder(torch.float32, torch.bfloat16)) == "bfloat16 matmuls (float32 weights)"
    )
    assert provenance.run_label(_Embedder(torch.float16, None)).endswith(
        "; similarities from float16 matmuls"
    )
