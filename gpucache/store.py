"""Exact-scan vector store: every stored row is scored against every query.

Shape vocabulary, used on every tensor line in gpucache:
    Q  queries in a batch          N  stored rows (the high-water mark of used slots)
    D  embedding dimension         K  candidates kept per query

Why an exact scan rather than an approximate index: a semantic cache must be able to say
"nothing stored is close enough", and an approximate index can only say "nothing I looked at
is". At the sizes a response cache reaches (1e4..1e6 rows) a dense matmul over the whole store
is also fast on a GPU and tolerable on a CPU, and it needs no training or rebuild.

Memory: the vectors live in one preallocated ``(capacity_alloc, D)`` device tensor that doubles
as it fills (amortised O(1) adds), with a scope id and an expiry time per row beside it. A
free row has scope id -1, so masking by scope also masks free rows. The scan walks the rows in
chunks so the ``(Q, chunk)`` score block never exceeds ``scan_budget_bytes``, and keeps a running
top-K, so a million rows can be scanned with a few megabytes of scratch.

The store is mechanism only: it never decides what to keep. The cache decides which row to
evict and tells the store to ``remove`` it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch

from gpucache.devices import DeviceLike, resolve_device

FREE = -1
NEVER = math.inf
MIN_SCAN_ROWS = 256  # below this a smaller chunk saves too little memory to be worth a retry


class ExactScanStore:
    """Rows of unit vectors with a scope and an expiry each, searched by exact dot product.

    Args:
        dim: embedding dimension D.
        device: where the vectors live ("auto", "cpu", "cuda[:N]").
        initial_rows: rows allocated up front; the tensor doubles when it fills.
        scan_budget_bytes: the most memory one (Q, chunk) fp32 score block may take.
    """

    def __init__(
        self,
        dim: int,
        *,
        device: DeviceLike = "auto",
        initial_rows: int = 1024,
        scan_budget_bytes: int = 64 * 2**20,
    ) -> None:
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if not isinstance(initial_rows, int) or initial_rows < 1:
            raise ValueError(f"initial_rows must be an int >= 1, got {initial_rows!r}")
        if not isinstance(scan_budget_bytes, int) or scan_budget_bytes < 4:
            raise ValueError(f"scan_budget_bytes must be an int >= 4, got {scan_budget_bytes!r}")
        self.dim = dim
        self.device = resolve_device(device)
        self.scan_budget_bytes = scan_budget_bytes
        self._vectors = torch.zeros((initial_rows, dim), dtype=torch.float32, device=self.device)
        self._scopes = torch.full((initial_rows,), FREE, dtype=torch.int64, device=self.device)
        self._expires = torch.full((initial_rows,), NEVER, dtype=torch.float64, device=self.device)
        self._free: list[int] = []  # freed rows below the high-water mark, reused first
        self._high = 0  # rows [0, high) have been used at least once
        self._count = 0
        self.scan_retries = 0  # scans retried in smaller chunks after running out of memory
        self.cpu_fallbacks = 0  # scans that ran on the CPU because the device ran out of memory
        self._falling_back = False

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Device bytes held by the allocated tensors (used and spare rows)."""
        return sum(t.numel() * t.element_size() for t in (self._vectors, self._scopes, self._expires))

    def add(self, vectors: torch.Tensor, scope_id: int, expires_at: Sequence[float]) -> list[int]:
        """Store (M, D) vectors in ``scope_id``; returns the M row numbers they took."""
        m = vectors.shape[0]
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape (M, {self.dim}), got {tuple(vectors.shape)}")
        if len(expires_at) != m:
            raise ValueError(f"expires_at has {len(expires_at)} entries for {m} vectors")
        if scope_id < 0:
            raise ValueError(f"scope_id must be >= 0, got {scope_id}")
        rows = self._take_rows(m)
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        self._vectors[index] = vectors.to(self.device, torch.float32)
        self._scopes[index] = scope_id
        self._expires[index] = torch.tensor(list(expires_at), dtype=torch.float64).to(self.device)
        self._count += m
        return rows

    def remove(self, rows: Sequence[int]) -> None:
        """Free ``rows``; a removed row can never be returned by ``search`` again."""
        if not rows:
            return
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        if bool((self._scopes[index] == FREE).any()):
            raise RuntimeError("gpucache bug: removing a row that is not in use")
        self._scopes[index] = FREE
        self._expires[index] = NEVER
        self._free.extend(rows)
        self._count -= len(rows)

    def set_expiry(self, rows: Sequence[int], expires_at: Sequence[float]) -> None:
        """Give stored ``rows`` new expiry times (seconds on the cache's clock, inf = never)."""
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        self._expires[index] = torch.tensor(list(expires_at), dtype=torch.float64).to(self.device)

    def expired_rows(self, now: float) -> list[int]:
        """Rows in use whose expiry is at or before ``now``: one vectorised pass, one transfer."""
        live = self._scopes[: self._high] != FREE
        dead = live & (self._expires[: self._high] <= now)
        return dead.nonzero().flatten().tolist()

    def clear(self) -> None:
        self._scopes[: self._high] = FREE
        self._expires[: self._high] = NEVER
        self._free.clear()
        self._high = 0
        self._count = 0

    def vectors(self, rows: Sequence[int]) -> torch.Tensor:
        """(M, D) copies of stored rows (for rescoring and persistence)."""
        return self._vectors[torch.tensor(list(rows), dtype=torch.int64, device=self.device)]

    def search(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float = -math.inf
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` rows by dot product among live rows of ``scope_id``, per query.

        Returns ``(scores, rows)``, both ``(Q, K)``, best first, padded with ``-inf`` / ``-1``
        where fewer than ``k`` rows qualify. Rows whose expiry is at or before ``now`` and rows
        of other scopes are masked inside the scan, never filtered afterwards in Python.
        """
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (Q, {self.dim}), got {tuple(queries.shape)}")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        q = queries.shape[0]
        if q == 0 or self._count == 0:
            return (
                torch.full((q, k), -math.inf, dtype=torch.float32, device=self.device),
                torch.full((q, k), -1, dtype=torch.int64, device=self.device),
            )
        chunk = max(1, min(self._high, self.scan_budget_bytes // (4 * q)))
        while True:
            try:
                return self._scan(queries.to(self.device, torch.float32), k, scope_id, now, chunk,
                                  self._vectors, self._scopes, self._expires)
            except torch.OutOfMemoryError:
                # The cache shares the device with a model, whose memory use moves: retry with
                # half the scratch, then scan CPU copies rather than fail the lookup.
                if chunk > MIN_SCAN_ROWS:
                    chunk //= 2
                    self.scan_retries += 1
                    continue
                break  # on a CPU store the copies may fail too: then that error propagates
        warnings.warn(
            f"gpucache: {self.device} ran out of memory during the similarity scan; this scan "
            "ran on the CPU", RuntimeWarning, stacklevel=2,
        )
        self.cpu_fallbacks += 1
        self._falling_back = True
        try:
            high = self._high
            scores, rows = self._scan(
                queries.to("cpu", torch.float32), k, scope_id, now, chunk,
                self._vectors[:high].cpu(), self._scopes[:high].cpu(), self._expires[:high].cpu(),
            )
        finally:
            self._falling_back = False
        return scores.to(self.device), rows.to(self.device)

    def _scan(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float, chunk: int,
        vectors: torch.Tensor, scopes: torch.Tensor, expires: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunked scan with a running top-k over rows [0, high) of the given tensors."""
        q, device = queries.shape[0], queries.device
        best_scores = torch.full((q, k), -math.inf, dtype=torch.float32, device=device)
        best_rows = torch.full((q, k), -1, dtype=torch.int64, device=device)
        for start in range(0, self._high, chunk):
            stop = min(start + chunk, self._high)
            scores = self._score(queries, vectors[start:stop])  # (Q, C)
            dead = (scopes[start:stop] != scope_id) | (expires[start:stop] <= now)  # (C,)
            scores.masked_fill_(dead, -math.inf)  # broadcast over queries
            top, idx = scores.topk(min(k, stop - start), dim=1)  # (Q, k'), (Q, k')
            merged_scores = torch.cat([best_scores, top], dim=1)  # (Q, K + k')
            merged_rows = torch.cat([best_rows, idx + start], dim=1)  # (Q, K + k')
            best_scores, pick = merged_scores.topk(k, dim=1)  # (Q, K)
            best_rows = merged_rows.gather(1, pick)  # (Q, K)
        best_rows.masked_fill_(best_scores == -math.inf, -1)
        return best_scores, best_rows

    def _score(self, queries: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        return queries @ block.T  # (Q, D) @ (D, C) -> (Q, C)

    def _take_rows(self, m: int) -> list[int]:
        reused = [self._free.pop() for _ in range(min(m, len(self._free)))]
        fresh = m - len(reused)
        if self._high + fresh > self._vectors.shape[0]:
            self._grow(self._high + fresh)
        rows = reused + list(range(self._high, self._high + fresh))
        self._high += fresh
        return rows

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * self._vectors.shape[0])
        extra = size - self._vectors.shape[0]
        self._vectors = torch.cat(
            [self._vectors, self._vectors.new_zeros((extra, self.dim))], dim=0
        )
        self._scopes = torch.cat([self._scopes, self._scopes.new_full((extra,), FREE)])
        self._expires = torch.cat([self._expires, self._expires.new_full((extra,), NEVER)])
