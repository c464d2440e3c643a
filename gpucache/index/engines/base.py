"""What an engine is handed, and what it promises.

An engine scans rows ``[0, high)`` of a ``RowsView`` in chunks of at most ``chunk`` rows and
returns the top ``k`` live rows per query, ``(scores, rows)``, both ``(Q, K)``, padded with
``-inf`` / ``-1`` (``gpucache.index.interface``). A row is live when its scope id is the
query's and its expiry is after ``now``; free rows carry scope id -1. Scores are those of the
stored precision: a quantized index rescores them exactly afterwards (``refine.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from gpucache.index.interface import DEFAULT_SCAN_BUDGET_BYTES
from gpucache.index.scratch import BufferSource


@dataclass(frozen=True)
class RowsView:
    """The stored rows as one scan sees them (tensors of the allocated length; the scan reads
    ``[0, high)``)."""

    vectors: torch.Tensor  # (N_alloc, D), the storage dtype
    scales: torch.Tensor  # (N_alloc,) fp32 per-row scales (int8), else empty
    scopes: torch.Tensor  # (N_alloc,) int64 scope ids, -1 for free rows
    expires: torch.Tensor  # (N_alloc,) float64 expiry times
    high: int  # rows [0, high) have been used

    def dead(self, start: int, stop: int, scope_id: int, now: float) -> torch.Tensor:
        """(C,) bool: rows of ``[start, stop)`` a query of ``scope_id`` must not see."""
        return (self.scopes[start:stop] != scope_id) | (self.expires[start:stop] <= now)


@dataclass(frozen=True)
class ScanJob:
    """One scan: the queries (Q, D) fp32 on the rows' device, and what to return."""

    queries: torch.Tensor
    k: int
    scope_id: int
    now: float
    chunk: int  # rows per chunk: the (Q, chunk) product stays within the scan budget
    budget: int = DEFAULT_SCAN_BUDGET_BYTES  # the scan budget itself, for engines with other scratch


class ScanEngine(Protocol):
    """Scans a ``RowsView`` for a ``ScanJob``; ``buffer`` lends reusable product memory
    (``gpucache.index.scratch``)."""

    name: str

    def scan(
        self, rows: RowsView, job: ScanJob, buffer: BufferSource
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
