"""What the benchmark runs on the machine it is given: the store sizes whose memory fits, and
the cells whose time fits, each left out with its reason stated.

Why: a benchmark that assumed a large machine ran for sixteen minutes on a 2-core, 24 GB one
and was killed by the kernel for memory, having written nothing. So the sizes are chosen from
memory measured when the scans begin, the models loaded (``MemoryPlan``: each scan cell's
bytes, counted from what each engine stores per row, against a stated fraction of what is
available), and the slow cells from time (``TimePlan``: a cell's cost projected from the same
engine's cost one size smaller, against the time the run has left). Both are pure arithmetic,
so the tests run them against a pretend machine.

One scan cell holds, at once: the seeded rows (N x D fp32, the one copy of the set the cell
makes), one storage mode's gpucache store (its rows on the device, plus the fp32 host copy a
quantized store keeps), FAISS's index of the same precision and FAISS's flat index (its
yardstick), and bounded work space (the store's scan budget, the brute force's blocks). Each
mode is its own cell, so no cell holds every mode's copy of the set at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucache.index.codecs import Codec
from gpucache.index.interface import DEFAULT_SCAN_BUDGET_BYTES

# The fraction of the memory available when the scans begin a scan cell may plan to hold: the rest is
# for what is not counted (the interpreter, torch, the models loaded, allocator slack).
MEMORY_FRACTION = 0.5
# Rows per block of the float64 brute force that recall is measured against, and per write
# into a store: work space bounded whatever N is.
BLOCK_ROWS = 65_536
# The stored-row sizes tried, smallest first; the largest that fit are run.
SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
QUERY_BATCHES = (1, 64, 1024)
QUICK_SIZES = (10_000,)
QUICK_QUERY_BATCHES = (1, 64)
# A call projected past this many seconds is timed once after its warm-up (``TimePlan``)
SLOW_CALL_SECONDS = 2.0
FAISS_BYTES_PER_VALUE = {"fp32": 4, "fp16": 2, "int8": 1}


def store_bytes(mode: str, n: int, dim: int) -> tuple[int, int]:
    """(device bytes, host bytes) of a gpucache store of ``n`` rows in ``mode``: its rows on
    the device (``Codec.row_bytes``) and the fp32 copy a quantized store keeps on the host."""
    host_copy = 0 if mode == "fp32" else 4 * dim * n
    return Codec.row_bytes(mode, dim) * n, host_copy


def scan_cell_bytes(mode: str, n: int, q: int, dim: int, *, on_gpu: bool, faiss: bool) -> tuple[int, int]:
    """(host bytes, device bytes) one scan cell of ``mode`` at ``n`` rows and up to ``q``
    queries holds at its peak (the module's docstring lists what)."""
    device, host_copy = store_bytes(mode, n, dim)
    rows = 4 * dim * n  # the seeded set
    faiss_bytes = 0
    if faiss:  # FAISS's index of the mode's precision (none for bf16), and the flat yardstick
        faiss_bytes = FAISS_BYTES_PER_VALUE.get(mode, 0) * dim * n + (4 * dim * n if mode != "fp32" else 0)
    # work space: the store's (Q, chunk) score block, the brute force's float64 block of rows
    # and its (Q, block) products, the queries
    scan_space = 2 * min(DEFAULT_SCAN_BUDGET_BYTES, 4 * q * n)
    brute = 8 * min(n, BLOCK_ROWS) * (dim + q) + 8 * q * dim
    host = rows + host_copy + faiss_bytes + brute + (0 if on_gpu else device + scan_space)
    # on a GPU, the Q = 1 cell's plain read of the rows (the bandwidth beside it) is a copy there
    return host, (device + scan_space + rows if on_gpu else 0)


@dataclass(frozen=True)
class Skipped:
    """A cell the run left out, and why (printed in the report)."""

    what: str
    why: str


@dataclass
class MemoryPlan:
    """The sizes whose every cell fits ``fraction`` of the memory available, per device.

    ``host_available`` and ``device_available`` are bytes measured at the start (the same
    number twice for a CPU run)."""

    host_available: int
    device_available: int
    on_gpu: bool
    faiss: bool
    fraction: float = MEMORY_FRACTION
    dim: int = 384
    skipped: list[Skipped] = field(default_factory=list)

    def sizes(self, candidates: tuple[int, ...], modes: list[str], q: int) -> list[int]:
        """The candidate sizes whose largest cell fits; the rest are recorded in ``skipped``."""
        host_budget = int(self.fraction * self.host_available)
        device_budget = int(self.fraction * self.device_available)
        chosen = []
        for n in candidates:
            cells = [self.cell(mode, n, q) for mode in modes]
            host = max(h for h, _ in cells)
            device = max(d for _, d in cells)
            if host <= host_budget and device <= device_budget:
                chosen.append(n)
                continue
            where = "host" if host > host_budget else "device"
            need, budget, available = (
                (host, host_budget, self.host_available)
                if where == "host"
                else (device, device_budget, self.device_available)
            )
            self.skipped.append(
                Skipped(
                    f"scan, N = {n:,}",
                    f"its largest cell needs {need / 2**30:.1f} GiB of {where} memory, past "
                    f"{self.fraction:.0%} of the {available / 2**30:.1f} GiB "
                    f"available when the scans began ({budget / 2**30:.1f} GiB)",
                )
            )
        return chosen

    def cell(self, mode: str, n: int, q: int) -> tuple[int, int]:
        return scan_cell_bytes(mode, n, q, self.dim, on_gpu=self.on_gpu, faiss=self.faiss)


@dataclass(frozen=True)
class CellPlan:
    """What one scan cell runs: which of its engines, and how many timed calls each makes."""

    admitted: list[bool]
    repeat: int


@dataclass
class TimePlan:
    """Which engine runs in which scan cell, and how often, by the time left.

    An engine's seconds per call at N are projected from its measured seconds at the next
    smaller N, scaled by N (a scan reads every row: its cost grows with N at least linearly, so
    the projection does not hide a slow cell). A cell where some engine's call projects past
    ``slow_call_seconds`` is timed once after its warm-up (a median of three 10 s calls says
    little more than one, at three times the cost). An engine whose projected cell would pass
    ``cell_seconds``, or the time left, is skipped and says so."""

    deadline: float  # seconds on the run's clock by which the scans must be done
    cell_seconds: float  # the most one engine may take in one cell
    repeat: int  # timed calls per engine in a cell whose calls are quick
    slow_call_seconds: float = SLOW_CALL_SECONDS
    measured: dict[tuple[str, str, int, int], float] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)

    def record(self, engine: str, mode: str, n: int, q: int, seconds: float) -> None:
        self.measured[(engine, mode, n, q)] = seconds

    def per_call(self, engine: str, mode: str, n: int, q: int) -> tuple[float, str] | None:
        """(projected seconds a call, from what) or None where nothing smaller was measured
        (the smallest size runs unprojected: it is the yardstick)."""
        smaller = [m for (e, md, m, qq) in self.measured if e == engine and md == mode and qq == q and m < n]
        if not smaller:
            return None
        m = max(smaller)
        measured = self.measured[(engine, mode, m, q)]
        return measured * n / m, f"{measured * n / m:.2f} s a call, from {measured:.3f} s at N = {m:,}"

    @staticmethod
    def calls(repeat: int) -> int:
        """Calls ``timed_together`` makes of each engine for ``repeat`` timed ones: a settling
        call before each of its blocks (forward, and reverse where repeat > 1)."""
        return repeat + (2 if repeat > 1 else 1)

    def admit(self, engines: list[tuple[str, str]], n: int, q: int, now: float) -> CellPlan:
        """The cell's plan: engines admitted in order while their projected total fits the
        time left, each timed ``repeat`` times (once where a call is slow)."""
        guesses = [self.per_call(engine, mode, n, q) for engine, mode in engines]
        slow = any(g is not None and g[0] > self.slow_call_seconds for g in guesses)
        repeat = 1 if slow else self.repeat
        left = self.deadline - now
        admitted = []
        for (engine, mode), guess in zip(engines, guesses):
            if guess is None:
                admitted.append(True)
                continue
            seconds = self.calls(repeat) * guess[0]
            if seconds > self.cell_seconds:
                why = f"projected {seconds:.0f} s ({guess[1]}), past {self.cell_seconds:.0f} s a cell"
            elif seconds > left:
                why = f"projected {seconds:.0f} s ({guess[1]}), past the {max(left, 0):.0f} s left"
            else:
                left -= seconds
                admitted.append(True)
                continue
            admitted.append(False)
            self.skipped.append(Skipped(f"scan {engine} {mode}, N = {n:,}, Q = {q}", why))
        return CellPlan(admitted, repeat)
