"""What a report was run on, read from the run itself: the commit (and whether the tree had
uncommitted changes), the CPU's model and threads, Python, torch, and, for a report whose
figures come from similarities, the precision the embedder's matmuls actually ran in.

Every report states these so that a figure can be traced to what produced it: a fixed string
such as "fp32" once labelled a run whose CPU had chosen bf16 matmuls.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from gpucache.benchmark.machine import commit, cpu_model

__all__ = ["commit", "cpu_model", "machine", "precision", "run_label"]


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
