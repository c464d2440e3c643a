"""ScanKernelChooser: pick the faster of two ways to scan by timing both on the store.

Why measure instead of configuring: whether the fused Triton kernel beats matmul + topk depends
on the GPU, the storage dtype, the number of queries per batch and the store's size. Its tiles
win where the (Q, N) score matrix is large (many queries, many rows) and can lose to cuBLAS at
Q = 1 or on a small store. A benchmark run on one GPU cannot settle it for every GPU a user
has, so a store with ``scan_kernel="auto"`` on CUDA measures both kernels on its own data the
first time it scans a given shape, and keeps the faster.

A shape is a query bucket (1, up to 64, more) and a size class (the store's rows, in powers of
4): a store that grows 4x is measured again. The measurement (about eight scans: a warm-up,
which also compiles the Triton kernel, and three timed runs per kernel) runs in a thread of its
own, never in the lookup that met the new shape: that lookup, and every lookup of the shape
until the measurement ends, scans with torch, so no lookup waits on a compile or holds the
cache's lock through eight scans. Below ``MIN_ROWS`` both kernels take well under a
millisecond and the torch path is used unmeasured. Both kernels return the same scores (fp32 in
IEEE precision, the half-precision modes rescored in fp32), so the choice moves speed only,
never an answer. A measurement that fails (out of memory, a compile error) settles the shape
on torch and keeps the error in ``errors``, so it is not retried on every lookup.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable

import torch

KERNELS = ("torch", "triton")
# A quantized CPU store's two ways to answer a scan: its quantized rows (then a rescore of the
# over-fetched candidates) or its exact fp32 copy (``gpucache.index.refine``).
STORE_PATHS = ("quantized", "copy")
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


def in_a_thread(measure: Callable[[], None]) -> None:
    """Run ``measure`` in a daemon thread of its own: how a chooser measures by default."""
    threading.Thread(target=measure, name="gpucache-kernel-choice", daemon=True).start()


class ScanKernelChooser:
    """Remembers, per (query bucket, size class), which of two ways to scan ran faster here.

    The same measurement decides the scan kernel on CUDA (torch against Triton, ``KERNELS``)
    and, on a CPU, whether a quantized store scans its quantized rows or its exact fp32 copy
    (``STORE_PATHS``): whether int8 products beat fp32 ones for a batch depends on the CPU
    (fast with VNNI, reported far slower than fp32 on an AVX2 machine without it;
    ``bench/reports/cpu-paths.md`` for this machine), so neither answer can be written down for every machine.

    Args:
        device: the store's device (the timer synchronises it).
        min_rows: stores smaller than this take the unmeasured choice without measuring.
        timer: ``timer(run, device) -> seconds``; replaceable for tests.
        start: ``start(measure)`` runs a measurement; by default in a thread of its own
            (``in_a_thread``), so the lookup that meets a new shape does not wait for it.
            ``lambda measure: measure()`` measures inline, in that lookup.
        options: the two (or more) names ``run`` takes; ties go to the first.
        unmeasured: ``unmeasured(queries, rows) -> name``, the choice for a shape not (yet)
            measured; by default the first option.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        min_rows: int = MIN_ROWS,
        timer: Callable[[Callable[[], object], torch.device], float] = wall_timer,
        start: Callable[[Callable[[], None]], None] = in_a_thread,
        options: tuple[str, ...] = KERNELS,
        unmeasured: Callable[[int, int], str] | None = None,
    ) -> None:
        self.device = device
        self.min_rows = min_rows
        self.options = options
        self._unmeasured = unmeasured or (lambda queries, rows: options[0])
        self._timer = timer
        self._start = start
        self._lock = threading.Condition()
        self._pending: set[tuple[str, int]] = set()
        self.choices: dict[tuple[str, int], str] = {}  # (bucket, size class) -> option
        self.timings: dict[tuple[str, int], dict[str, float]] = {}  # seconds, as measured
        self.errors: dict[tuple[str, int], str] = {}  # shapes whose measurement failed

    def choose(self, queries: int, rows: int, run: Callable[[str], object]) -> str:
        """The option for a scan of ``queries`` over ``rows``: the measured faster one, or the
        unmeasured choice while the shape is unmeasured. ``run(option)`` performs such a scan
        the named way; it is called only by the measurement, which a new shape starts."""
        fallback = self._unmeasured(queries, rows)
        if rows < self.min_rows:
            return fallback
        shape = (bucket(queries), size_class(rows))
        with self._lock:
            if shape in self.choices or shape in self._pending:
                return self.choices.get(shape, fallback)
            self._pending.add(shape)
        self._start(functools.partial(self._measure, shape, run, fallback))
        with self._lock:
            return self.choices.get(shape, fallback)

    def wait_measured(self, timeout: float | None = None) -> bool:
        """Block until no measurement is running; False if ``timeout`` seconds pass first."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending, timeout)

    def _measure(self, shape: tuple[str, int], run: Callable[[str], object], fallback: str) -> None:
        try:
            seconds = {k: self._timer(functools.partial(run, k), self.device) for k in self.options}
            choice, error = min(self.options, key=seconds.__getitem__), None  # a tie keeps the first
        except Exception as exc:  # noqa: BLE001 - any failure settles the shape unmeasured
            seconds, choice, error = {}, fallback, f"{type(exc).__name__}: {exc}"
        with self._lock:
            if error is None:
                self.timings[shape] = seconds
            else:
                self.errors[shape] = error
            self.choices[shape] = choice
            self._pending.discard(shape)
            self._lock.notify_all()
