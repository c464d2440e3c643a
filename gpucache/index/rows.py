"""The row table: which rows are in use, in which scope, until when.

Rows live in preallocated tensors that double as they fill (amortised O(1) adds). A free row
has scope id -1 (``FREE``), so masking by scope also masks free rows. Freed rows below the
high-water mark are reused first.

Expiry has one owner, this table. The scan masks on the device copy; the cache's exact tier
reads ``expires_at(row)`` from a host copy, so a lookup on a CUDA index does not wait on the
device for one number. Both are written together, here only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpucache.index.interface import FREE, NEVER


class RowTable:
    def __init__(self, rows: int, device: torch.device) -> None:
        self.device = device
        self.scopes = torch.full((rows,), FREE, dtype=torch.int64, device=device)  # (N_alloc,)
        self.expires = torch.full((rows,), NEVER, dtype=torch.float64, device=device)  # (N_alloc,)
        self._expires_host = self.expires if device.type == "cpu" else self.expires.cpu()
        # a numpy view of the same memory: reading one row's expiry through it is a plain
        # array read, where a tensor index builds a tensor first (the exact tier reads one per hit)
        self._expires_view = self._expires_host.numpy()
        self._free: list[int] = []  # freed rows below the high-water mark, reused first
        self.high = 0  # rows [0, high) have been used at least once
        self.count = 0

    @property
    def capacity(self) -> int:
        return self.scopes.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.scopes, self.expires))

    def fresh_needed(self, m: int) -> int:
        """Rows beyond the high-water mark that taking ``m`` rows needs."""
        return max(0, m - len(self._free))

    def take(self, m: int) -> list[int]:
        """``m`` rows to fill, reused ones first; the caller grew the table first where
        ``high + fresh_needed(m)`` exceeds the capacity."""
        reused = [self._free.pop() for _ in range(min(m, len(self._free)))]
        fresh = m - len(reused)
        if self.high + fresh > self.capacity:
            raise RuntimeError("gpucache bug: rows taken beyond the allocation")
        rows = reused + list(range(self.high, self.high + fresh))
        self.high += fresh
        self.count += m
        return rows

    def grow(self, extra: int) -> None:
        self.scopes = torch.cat([self.scopes, self.scopes.new_full((extra,), FREE)])
        self.expires = torch.cat([self.expires, self.expires.new_full((extra,), NEVER)])
        if self.device.type == "cpu":
            self._expires_host = self.expires
        else:
            self._expires_host = torch.cat([self._expires_host, self._expires_host.new_full((extra,), NEVER)])
        self._expires_view = self._expires_host.numpy()

    def assign(self, rows: Sequence[int], scope_id: int, expires_at: Sequence[float]) -> None:
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        self.scopes[index] = scope_id
        self.set_expiry(rows, expires_at)

    def set_expiry(self, rows: Sequence[int], expires_at: Sequence[float]) -> None:
        """Give ``rows`` new expiry times (seconds on the cache's clock, inf = never)."""
        index = torch.tensor(list(rows), dtype=torch.int64)
        values = torch.tensor(list(expires_at), dtype=torch.float64)
        self._expires_host[index] = values
        if self.device.type != "cpu":
            self.expires[index.to(self.device)] = values.to(self.device)

    def expires_at(self, row: int) -> float:
        return float(self._expires_view[row])

    def release(self, rows: Sequence[int]) -> None:
        """Free ``rows``; freeing a row not in use is a bug, not silence."""
        if not rows:
            return
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        if bool((self.scopes[index] == FREE).any()):
            raise RuntimeError("gpucache bug: removing a row that is not in use")
        self.scopes[index] = FREE
        self.set_expiry(rows, [NEVER] * len(rows))
        self._free.extend(rows)
        self.count -= len(rows)

    def expired_rows(self, now: float) -> list[int]:
        """Rows in use whose expiry is at or before ``now``: one vectorised pass, one transfer."""
        live = self.scopes[: self.high] != FREE
        dead = live & (self.expires[: self.high] <= now)
        return dead.nonzero().flatten().tolist()

    def clear(self) -> None:
        self.scopes[: self.high] = FREE
        self.expires[: self.high] = NEVER
        self._expires_host[: self.high] = NEVER
        self._free.clear()
        self.high = 0
        self.count = 0
