"""ScanKernelChooser: pick the faster of the two scan kernels by timing both on the store.

Why measure instead of configuring: whether the fused Triton kernel beats matmul + topk depends
on the GPU, the storage dtype, the number of queries per batch and the store's size. Its tiles
win where the (Q, N) score matrix is large (many queries, many rows) and can lose to cuBLAS at
Q = 1 or on a small store. A benchmark run on one GPU cannot settle it for every GPU a user
has, so a store with ``scan_kernel="auto"`` on CUDA measures both kernels on its own data the
first time it scans a given shape, and keeps the faster.

A shape is a query bucket (1, up to 64, more) and a size class (the store's rows, in powers of
4): a store that grows 4x is measured again. The lookup that meets a new shape pays for the
measurement, about eight scans (a warm-up and three timed runs per kernel), once per shape.
Below ``MIN_ROWS`` both kernels take well under a millisecond and the torch path is used
unmeasured. Both kernels return the same scores (fp32 in IEEE precision, the half-precision
modes rescored in fp32), so the choice moves speed only, never an answer.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch

KERNELS = ("torch", "triton")
MIN_ROWS = 65536
TIMED_RUNS = 3  # after one warm-up run, which also compiles the Triton kernel


def bucket(queries: int) -> str:
    """The query-count bucket a measurement stands for."""
    if queries <= 1:
        return "1"
    return "<=64" if queries <= 64 else ">64"


def size_class(rows: int) -> int:
    """Rows in powers of 4: a store 4x larger is a new shape (integer arithmetic, exact at
    every boundary, where a float logarithm rounds)."""
    return (max(rows, 1).bit_length() - 1) // 2


def wall_timer(
    run: Callable[[], object], device: torch.device, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Median seconds of ``TIMED_RUNS`` runs after a warm-up, synchronising the device."""
    def once() -> float:
        start = clock()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return clock() - start

    once()
    return statistics.median(once() for _ in range(TIMED_RUNS))


class ScanKernelChooser:
    """Remembers, per (query bucket, size class), which kernel ran faster here.

    Args:
        device: the store's device (the timer synchronises it).
        min_rows: stores smaller than this use the torch path without measuring.
        timer: ``timer(run, device) -> seconds``; replaceable for tests.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        min_rows: int = MIN_ROWS,
        timer: Callable[[Callable[[], object], torch.device], float] = wall_timer,
    ) -> None:
        self.device = device
        self.min_rows = min_rows
        self._timer = timer
        self.choices: dict[tuple[str, int], str] = {}  # (bucket, size class) -> kernel
        self.timings: dict[tuple[str, int], dict[str, float]] = {}  # seconds, as measured

    def choose(self, queries: int, rows: int, run: Callable[[str], object]) -> str:
        """The kernel for a scan of ``queries`` over ``rows``; ``run(kernel)`` performs that
        scan with the named kernel and is called only while a new shape is measured."""
        if rows < self.min_rows:
            return "torch"
        shape = (bucket(queries), size_class(rows))
        if shape not in self.choices:
            seconds = {k: self._timer(functools.partial(run, k), self.device) for k in KERNELS}
            self.timings[shape] = seconds
            self.choices[shape] = min(KERNELS, key=seconds.__getitem__)  # a tie keeps torch
        return self.choices[shape]
