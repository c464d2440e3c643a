"""The CPU scan's product buffers, kept from one scan to the next.

Why keep them: a CPU scan writes each chunk's (Q, C) products into one buffer, and a fresh
buffer is fresh pages, which the kernel must fault in and zero before the product can land in
them. Right after the embedder had run (the order of every ``get_or_put_all``) that cost more
than the scan itself (``bench/reports/performance-notes.md``, "Kept scan buffers").

What it costs: a store holds, between scans, the largest buffers a scan has asked of it; a
(Q, chunk) block never exceeds the store's ``scan_budget_bytes``, so that is at most the
budget (fp32, bf16 or int32 products, by the store's mode). ``nbytes``
says how much; ``release`` gives it back (and ``ExactScanStore.clear`` does).

Two scans at once on the same store (a store used from several threads without the cache's
lock) do not wait for each other: the one that finds the buffers lent out takes fresh ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

BufferSource = Callable[[int, torch.dtype], torch.Tensor]


def host_buffer(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D CPU tensor of ``n`` elements from numpy's allocator, for the scan's product buffer.

    numpy asks Linux for transparent huge pages on large arrays (torch's allocator does not),
    and a product written into such a buffer runs faster: fewer page faults and TLB misses."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.empty(n * itemsize, dtype=np.uint8)).view(dtype)


class ScanScratch:
    """Product buffers lent to one scan at a time, one per dtype, grown to the largest asked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[torch.dtype, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        """Host bytes held between scans."""
        return sum(t.numel() * t.element_size() for t in list(self._kept.values()))

    @contextmanager
    def lend(self, keep: bool = True) -> Iterator[BufferSource]:
        """A source of buffers for one scan: ``source(n, dtype)`` is a 1-D tensor of ``n``
        elements, valid until the scan ends; one buffer per dtype (a second ask for the same
        dtype returns the same memory). ``keep=False``, or buffers already lent to another
        scan, give fresh buffers that are dropped afterwards (a CUDA store's rare CPU fallback
        should not pin host memory)."""
        if not keep or not self._lock.acquire(blocking=False):
            yield host_buffer
            return
        try:
            yield self._take
        finally:
            self._lock.release()

    def release(self) -> None:
        """Drop the kept buffers (after the scan that holds them, if one is running)."""
        with self._lock:
            self._kept.clear()

    def _take(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        kept = self._kept.get(dtype)
        if kept is None or kept.numel() < n:
            kept = self._kept[dtype] = host_buffer(n, dtype)
        return kept[:n]
