"""ScanKernelChooser: pick the faster of two ways to scan by timing both on the store.

Why measure instead of configuring: whether the fused Triton kernel beats matmul + topk depends
on the GPU, the storage dtype, the number of queries per batch and the store's size. Its tiles
win where the (Q, N) score matrix is large (many queries, many rows) and can lose to cuBLAS at
Q = 1 or on a small store. A benchmark run on one GPU cannot settle it for every GPU a user
has, so a store with ``scan_kernel="auto"`` on CUDA measures both kernels on its own data the
first time it scans a given shape, and keeps the faster.

A shape is a query bucket (1, up to 64, more) and a size class (the store's rows, in powers of
4): a store that grows 4x is measured again. A bucket is measured at its own largest shape
(``bucket_top``: 1, 64 or 256 queries), whatever the batch that met it: a 2-query first batch
must not decide for the 64-query batches that follow. Each timed run waits until no caller's
scan is running (``scanning``), so a measurement neither slows a caller's scan nor is slowed
by one; and a shape whose observed scans stray far from what was measured (``observe``: over
``STRAY`` times slower, ``STRAYS_IN_A_ROW`` scans running) is measured again, at most
``MAX_REMEASURES`` times. One slow scan is not enough: the first scan after other work (caches
cold, another store's rows in them) strays alone, and measuring again for it left a shape on
its unmeasured path, beside a measurement, for the next scans (bench/reports/cpu-paths.md).

The measurement (twelve scans: a warm-up, which also compiles the Triton kernel, and five timed
runs per kernel) runs in a thread of its own, never in the lookup that met the new shape: that
lookup, and every lookup of the shape until the measurement ends, scans the unmeasured way, so
no lookup waits on a compile or holds the cache's lock through the measurement. Below
``MIN_ROWS`` both kernels take well under a millisecond and the torch path is used unmeasured.
Both kernels return the same scores (fp32 in IEEE precision, the half-precision modes rescored
in fp32), so the choice moves speed only,
never an answer. A measurement that fails (out of memory, a compile error) settles the shape
on torch and keeps the error in ``errors``, so it is not retried on every lookup.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import torch

KERNELS = ("torch", "triton")
# A quantized CPU store's two ways to answer a scan: its quantized rows (then a rescore of the
# over-fetched candidates) or its exact fp32 copy (``gpucache.index.refine``).
STORE_PATHS = ("quantized", "copy")
MIN_ROWS = 65536
TIMED_RUNS = 5  # after one warm-up run, which also compiles the Triton kernel
STRAY = 4.0  # an observed scan this many times slower than measured: measure the shape again
MAX_REMEASURES = 3  # per shape: a machine whose timings swing is not measured forever
STRAYS_IN_A_ROW = 3  # stray scans, one after another, that say the machine changed
IDLE_WAIT = 0.5  # seconds a timed run waits for callers' scans to end before it runs anyway


def bucket(queries: int) -> str:
    """The query-count bucket a measurement stands for."""
    if queries <= 1:
        return "1"
    return "<=64" if queries <= 64 else ">64"


def bucket_top(queries: int) -> int:
    """The batch a bucket is measured at: its largest (256 for the open bucket past 64)."""
    return {"1": 1, "<=64": 64, ">64": 256}[bucket(queries)]


def size_class(rows: int) -> int:
    """Rows in powers of 4: a store 4x larger is a new shape (integer arithmetic, exact at
    every boundary, where a float logarithm rounds)."""
    return (max(rows, 1).bit_length() - 1) // 2


def wall_timer(
    run: Callable[[], object],
    device: torch.device,
    clock: Callable[[], float] = time.perf_counter,
    before: Callable[[], object] = lambda: None,
) -> float:
    """Median seconds of ``TIMED_RUNS`` runs after a warm-up, synchronising the device;
    ``before()`` is called ahead of each run, outside its timing."""

    def once() -> float:
        before()
        if _EXITING.is_set():
            raise MeasurementStopped("the interpreter is exiting")
        start = clock()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return clock() - start

    once()
    return statistics.median(once() for _ in range(TIMED_RUNS))


class MeasurementStopped(Exception):
    """The interpreter is exiting: a measurement gives up between two runs (``at_exit``)."""


_EXITING = threading.Event()
_MEASURING: set[threading.Thread] = set()
_MEASURING_LOCK = threading.Lock()
EXIT_WAIT = 30.0  # seconds the interpreter's exit waits for a measurement's run in progress


def in_a_thread(measure: Callable[[], None]) -> None:
    """Run ``measure`` in a daemon thread of its own: how a chooser measures by default. The
    thread is known to ``at_exit``, which lets it end before the interpreter does."""

    def tracked() -> None:
        try:
            measure()
        finally:
            with _MEASURING_LOCK:
                _MEASURING.discard(threading.current_thread())

    thread = threading.Thread(target=tracked, name="gpucache-kernel-choice", daemon=True)
    with _MEASURING_LOCK:
        _MEASURING.add(thread)
    thread.start()


def measuring() -> int:
    """Measurements running now, in every chooser of the process (``in_a_thread``)."""
    with _MEASURING_LOCK:
        return sum(thread.is_alive() for thread in _MEASURING)


@atexit.register
def at_exit() -> None:
    """Stop the measurements still running, at their next run, and wait for them. Why: a
    daemon thread still inside a torch product when the interpreter finalizes ends the process
    with "terminate called without an active exception" (SIGABRT, status 134): a script that
    exits right after its first large scan would fail for a measurement it never asked for."""
    _EXITING.set()
    with _MEASURING_LOCK:
        running = list(_MEASURING)
    deadline = time.monotonic() + EXIT_WAIT
    for thread in running:
        thread.join(max(0.0, deadline - time.monotonic()))


class ScanKernelChooser:
    """Remembers, per (query bucket, size class), which of two ways to scan ran faster here.

    The same measurement decides the scan kernel on CUDA (torch against Triton, ``KERNELS``)
    and, on a CPU, whether a quantized store scans its quantized rows or its exact fp32 copy
    (``STORE_PATHS``): whether int8 products beat fp32 ones for a batch depends on the CPU
    (fast with VNNI; without it an int8 batch may be slower than fp32, not measured here:
    ``bench/reports/cpu-paths.md`` for this machine), so neither answer holds for every machine.

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
        idle_wait: seconds a timed run waits for callers' scans to end (``scanning``) before it
            runs anyway, so a busy store is still measured.
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
        idle_wait: float = IDLE_WAIT,
    ) -> None:
        self.device = device
        self.min_rows = min_rows
        self.options = options
        self._unmeasured = unmeasured or (lambda queries, rows: options[0])
        self._timer: Callable[[Callable[[], object], torch.device], float] = (
            functools.partial(wall_timer, before=self._wait_idle) if timer is wall_timer else timer
        )
        self._start = start
        self._lock = threading.Condition()
        self._pending: set[tuple[str, int]] = set()
        self.choices: dict[tuple[str, int], str] = {}  # (bucket, size class) -> option
        self.timings: dict[tuple[str, int], dict[str, float]] = {}  # seconds, as measured
        self.errors: dict[tuple[str, int], str] = {}  # shapes whose measurement failed
        self.remeasured: dict[tuple[str, int], int] = {}  # shapes measured again (``observe``)
        self._strays: dict[tuple[str, int], int] = {}  # stray scans in a row, per shape
        self._scanning = 0  # callers' scans running now (``scanning``)
        self.idle_wait = idle_wait  # seconds a timed run waits for them, then runs anyway
        self.idle_waits = 0  # timed runs that waited for callers' scans to end

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

    @contextlib.contextmanager
    def scanning(self) -> Iterator[None]:
        """Around a caller's scan: a measurement's timed runs wait until none is running."""
        with self._lock:
            self._scanning += 1
        try:
            yield
        finally:
            with self._lock:
                self._scanning -= 1
                self._lock.notify_all()

    def _wait_idle(self) -> None:
        with self._lock:
            if self._scanning:
                self.idle_waits += 1
                self._lock.notify_all()
                self._lock.wait_for(lambda: not self._scanning, self.idle_wait)

    def wait_for(self, predicate: Callable[[ScanKernelChooser], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate(self)`` holds (tests: "the measurement is waiting")."""
        with self._lock:
            return self._lock.wait_for(lambda: predicate(self), timeout)

    def observe(self, queries: int, rows: int, option: str, seconds: float) -> None:
        """A caller's scan of ``queries`` over ``rows`` took ``seconds`` the ``option`` way:
        where the shape was measured (at its largest batch) and this is the
        ``STRAYS_IN_A_ROW``-th scan running over ``STRAY`` times slower, the machine has changed
        under the measurement (another load, a frequency drop, a store grown within its class):
        the shape is measured again at its next scan. A scan within ``STRAY`` starts the count
        over."""
        if rows < self.min_rows:
            return
        shape = (bucket(queries), size_class(rows))
        with self._lock:
            measured = self.timings.get(shape, {}).get(option)
            if (
                measured is None
                or self.choices.get(shape) != option
                or self.remeasured.get(shape, 0) >= MAX_REMEASURES
                or shape in self._pending
            ):
                return
            if seconds <= STRAY * measured:
                self._strays.pop(shape, None)
                return
            self._strays[shape] = self._strays.get(shape, 0) + 1
            if self._strays[shape] < STRAYS_IN_A_ROW:
                return
            del self._strays[shape]
            self.remeasured[shape] = self.remeasured.get(shape, 0) + 1
            del self.choices[shape], self.timings[shape]

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
