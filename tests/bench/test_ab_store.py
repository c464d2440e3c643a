"""bench/ab_store.py: this checkout's store against another revision's, paired."""

from __future__ import annotations

import subprocess
import sys


def test_the_paired_store_comparison_runs_against_a_git_revision():
    """bench/ab_store.py: this checkout's store against HEAD's, both exact enough to compare."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [
            sys.executable,
            str(root / "bench" / "ab_store.py"),
            "--base",
            "HEAD",
            "--n",
            "600",
            "--q",
            "1,8",
            "--mode",
            "int8",
            "--rounds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("commit ") and "torch" in lines[0]
    assert lines[1].startswith("int8, N = 600, k = 4")
    assert lines[2].startswith("Q = 1: base ") and lines[3].startswith("Q = 8: base ")
    assert "(1.0000)" in lines[2]
