"""What a report was run on, read from the run itself: the commit (and whether the tree had
uncommitted changes), the CPU's model and threads, Python, torch, and, for a report whose
figures come from similarities, the precision the embedder's matmuls actually ran in.

Every report states these so that a figure can be traced to what produced it: a fixed string
such as "fp32" once labelled a run whose CPU had chosen bf16 matmuls.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's short commit, with "+changes" where tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what the platform reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """The CPU, its threads and the software stack, in one phrase."""
    import torch

    return (
        f"{cpu_model()} ({platform.machine()}), {os.cpu_count()} CPU threads, torch "
        f"{torch.__version__} with {torch.get_num_threads()} threads, Python {sys.version.split()[0]}"
    )


def precision(embedder: Any) -> str:
    """The precision of the embedder's similarities as it runs them: its matmuls' dtype (under
    autocast where the load adopted it) and its weights' dtype."""
    weights = str(embedder.dtype).removeprefix("torch.")
    matmuls = str(getattr(embedder, "autocast_dtype", None) or embedder.dtype).removeprefix("torch.")
    return f"{matmuls} matmuls" + ("" if matmuls == weights else f" ({weights} weights)")


def run_label(embedder: Any = None) -> str:
    """commit, machine and, given an embedder, the precision of its similarities."""
    text = f"commit {commit()}, {machine()}"
    return text + (f"; similarities from {precision(embedder)}" if embedder is not None else "")
