"""What the cache asks of an index, and the constants every part of the index shares.

Shape vocabulary, used on every tensor line in gpucache:
    Q  queries in a batch          N  stored rows (the high-water mark of used slots)
    D  embedding dimension         K  candidates kept per query

A search returns ``(scores, rows)``, both ``(Q, K)``, best first, padded with ``-inf`` / ``-1``
where fewer than ``K`` rows qualify (FAISS's convention), so callers never handle ragged
results. Rows of another scope, free rows and rows whose expiry has passed are masked inside the
scan, never filtered afterwards.

The index is mechanism only: it never decides what to keep. The cache decides which row to
evict and tells the index to ``remove`` it. This module imports no torch at run time, so the
cache's settings can name these constants without loading it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

FREE = -1  # the scope id of a free row: masking by scope masks free rows too
NEVER = math.inf  # the expiry of a row that never expires
QUANTIZATIONS = ("fp32", "fp16", "bf16", "int8")
AUTO = "auto"  # a quantization the store resolves for its device: ``store.resolve_quantization``
SCAN_KERNELS = ("auto", "torch", "triton")
# The most scratch one (Q, chunk) score block may take: a million rows scan in a few megabytes.
DEFAULT_SCAN_BUDGET_BYTES = 64 * 2**20


def check_quantization(quantization: object) -> None:
    """Raise ValueError unless ``quantization`` is None, "auto" or one of ``QUANTIZATIONS``."""
    if quantization is not None and quantization != AUTO and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be None, {AUTO!r} or one of {QUANTIZATIONS}, got {quantization!r}"
        )


@runtime_checkable
class VectorIndex(Protocol):
    """Rows of unit vectors with a scope id and an expiry time each, searched by dot product."""

    dim: int

    def __len__(self) -> int: ...

    def add(self, vectors: torch.Tensor, scope_id: int, expires_at: Sequence[float]) -> list[int]:
        """Store (M, D) vectors in ``scope_id``; returns the M row numbers they took."""
        ...

    def remove(self, rows: Sequence[int]) -> None:
        """Free ``rows``; a removed row is never returned by ``search`` again."""
        ...

    def set_expiry(self, rows: Sequence[int], expires_at: Sequence[float]) -> None: ...

    def expires_at(self, row: int) -> float:
        """When ``row`` expires, in seconds on the cache's clock (inf: never)."""
        ...

    def expired_rows(self, now: float) -> list[int]: ...

    def search(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float = -math.inf
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` live rows of ``scope_id`` per query: ``(scores, rows)``, ``(Q, K)`` each."""
        ...

    def vectors(self, rows: Sequence[int]) -> torch.Tensor:
        """(M, D) full-precision copies of stored rows."""
        ...

    def clear(self) -> None: ...
