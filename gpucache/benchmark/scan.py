"""The scan cell: gpucache's store in each storage mode beside FAISS's index of the same
precision and FAISS's flat index, on the same seeded rows and queries, with recall against a
float64 brute force.

Data are seeded random unit vectors (the scan's cost does not depend on their meaning). Each
(N, Q, mode) is one cell: its engines are built for it, timed together (``timed_together``:
in blocks, forward then reverse, so their ratios hold on a busy machine) and dropped before the
next mode's, so no cell holds more than the seeded set and what its own engines store
(``sizing.py`` counts it). Recall is against a brute force in float64 blocks on the CPU,
outside every engine measured.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gpucache.benchmark.sizing import BLOCK_ROWS, Skipped, TimePlan
from gpucache.benchmark.timing import timed_together
from gpucache.index.kernel_choice import bucket, size_class
from gpucache.index.store import ExactScanStore

# Queries recall is measured on (the first ones of each batch): the float64 reference for 256
# queries over a million rows took longer on a 2-core CPU than most of that size's cells.
REFERENCE_QUERIES = 64


@dataclass
class ScanResult:
    device: str
    engine: str  # "gpucache" (":kernel" where a chooser picked one), "gpucache-triton", "faiss"
    mode: str
    n: int
    q: int
    seconds: float
    spread: float
    queries_per_s: float
    gb_per_s: float  # bytes the storage mode holds for N rows, read once per batch
    recall_at_k: float | None = None
    # Q = 1: GB/s of a plain sum over the N x D fp32 rows, timed in the same blocks as the
    # engines; the memory-bound fraction is taken of it
    read_gb_per_s: float | None = None
    # queries/s of FAISS IndexFlatIP timed in the same cell (the "vs FAISS flat" yardstick)
    flat_queries_per_s: float | None = None
    # timed calls behind the median (after a settling call per block): fewer where calls are slow
    timed_calls: int | None = None


@dataclass
class _Engine:
    label: str  # "gpucache", "gpucache-triton", "gpucache-auto", "faiss"
    mode: str
    search: Callable[[Any, int], Any]  # (queries, k) -> rows (Q, K) as a tensor or array
    bytes_per_row: int
    device: str
    store: ExactScanStore | None = None
    reported: bool = True  # False for FAISS's flat index in another mode's cell: a yardstick


def bench_scan(
    device: torch.device,
    ns: list[int],
    qs: list[int],
    modes: list[str],
    k: int,
    repeat: int,
    plan: TimePlan,
    *,
    dim: int = 384,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[str], None] = lambda line: None,
    telemetry: list[dict[str, Any]] | None = None,
) -> list[ScanResult]:
    """Every mode's cell for every N (smallest first) and Q, as far as ``plan`` admits."""
    results: list[ScanResult] = []
    gen = torch.Generator().manual_seed(0)
    for n in ns:
        data = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen), dim=1)
        queries_all = torch.nn.functional.normalize(
            data[torch.randint(0, n, (max(qs),), generator=gen)]
            + 0.2 * torch.randn(max(qs), dim, generator=gen),
            dim=1,
        )
        reference = brute_force_top_k(data, queries_all[:REFERENCE_QUERIES], k)
        for mode in sorted(modes, key=lambda m: m != "fp32"):
            results += _mode_cells(
                device, data, queries_all, reference, mode, qs, k, plan, clock, progress, telemetry
            )
            # the mode's engines are gone with the call: collected before the next mode's are
            # built, so two modes' copies of the set are never held at once
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del data, queries_all
    return results


def _mode_cells(
    device: torch.device,
    data: torch.Tensor,
    queries_all: torch.Tensor,
    reference: list[list[int]],
    mode: str,
    qs: list[int],
    k: int,
    plan: TimePlan,
    clock: Callable[[], float],
    progress: Callable[[str], None],
    telemetry: list[dict[str, Any]] | None,
) -> list[ScanResult]:
    """One storage mode's cells at one N: its engines built once, every Q the plan admits."""
    n = data.shape[0]
    results: list[ScanResult] = []
    engines = _our_engines(device, data, mode) + _faiss_engines(data, mode)
    for q in qs:
        cell = plan.admit([(e.label, e.mode) for e in engines], n, q, clock())
        chosen = [e for e, ok in zip(engines, cell.admitted) if ok]
        if not any(e.store is not None for e in chosen):
            continue
        progress(
            f"scan {mode}, N = {n:,}, Q = {q}: {', '.join(f'{e.label} {e.mode}' for e in chosen)}"
            + (f", timed {cell.repeat}x" if cell.repeat != plan.repeat else "")
        )
        results += _cell(device, data, queries_all[:q], reference, chosen, k, cell.repeat, plan)
        if telemetry is not None and device.type == "cuda":
            from gpucache.telemetry import gpu_readings

            telemetry += [{"n": n, "q": q, "mode": mode, **asdict(r)} for r in gpu_readings()[:1]]
    return results


def _cell(
    device: torch.device,
    data: torch.Tensor,
    queries: torch.Tensor,
    reference: list[list[int]],
    engines: list[_Engine],
    k: int,
    repeat: int,
    plan: TimePlan,
) -> list[ScanResult]:
    n, q = data.shape[0], queries.shape[0]
    on_device, on_host = queries.to(device), queries.numpy()
    engines = _measured(engines, on_device, k, n, q, plan)
    if not any(e.store is not None for e in engines):
        return []
    calls: list[Callable[[], Any]] = [
        functools.partial(e.search, on_host if e.label == "faiss" else on_device, k) for e in engines
    ]
    # The machine's read bandwidth moved from 15.7 to 53.5 GB/s within one session on a shared
    # machine, so a figure from minutes before could make a memory-bound scan look twice as
    # good or bad: at Q = 1 a plain read of the same rows is timed with the engines, and the
    # fraction is of that.
    read: list[Callable[[], Any]] = [functools.partial(torch.sum, data.to(device))] if q == 1 else []
    counts: list[int] = []
    timings = timed_together(calls + read, device, repeat, counts=counts)
    read_gb_per_s = data.numel() * 4 / timings.pop()[0] / 1e9 if read else None
    del read
    flat = next(
        (q / s for e, (s, _) in zip(engines, timings) if e.label == "faiss" and e.mode == "fp32"), None
    )
    results = []
    for engine, call, (seconds, spread), timed_calls in zip(engines, calls, timings, counts):
        plan.record(engine.label, engine.mode, n, q, seconds)
        if not engine.reported:
            continue
        rows = _rows_list(call())[: len(reference)]
        recall = sum(len(set(a) & set(b)) for a, b in zip(rows, reference)) / (len(rows) * k)
        label = engine.label
        chooser = engine.store.kernel_chooser if engine.store is not None else None
        if chooser is not None:  # say which kernel the default chose
            label += ":" + chooser.choices.get((bucket(q), size_class(n)), "torch")
        results.append(
            ScanResult(
                engine.device,
                label,
                engine.mode,
                n,
                q,
                seconds,
                spread,
                q / seconds,
                n * engine.bytes_per_row / seconds / 1e9,
                recall,
                read_gb_per_s,
                flat if engine.label != "faiss" or engine.mode != "fp32" else None,
                timed_calls,
            )
        )
    return results


def _measured(
    engines: list[_Engine], queries: torch.Tensor, k: int, n: int, q: int, plan: TimePlan
) -> list[_Engine]:
    """The engines ready to be timed. A store that measures how to scan (its kernels on CUDA,
    a quantized CPU store its two paths) does so at its first scan of a shape, in a thread of
    its own: it is timed once measured, as it serves from then on, and not while the
    measurement shares the cores with every engine of the cell. One whose measurement runs past
    the cell's time is left out, and said so."""
    ready = []
    for engine in engines:
        store = engine.store
        choosers = [c for c in (store.kernel_chooser, store.path_chooser) if c is not None] if store else []
        if choosers:
            engine.search(queries, k)  # the shape's first scan: its measurement starts
            if not all(chooser.wait_measured(plan.cell_seconds) for chooser in choosers):
                plan.skipped.append(
                    Skipped(
                        f"scan {engine.label} {engine.mode}, N = {n:,}, Q = {q}",
                        f"its store still measured its scan paths after {plan.cell_seconds:.0f} s (in a "
                        "thread of its own, which the cells after it share the cores with)",
                    )
                )
                continue
        ready.append(engine)
    return ready


def brute_force_top_k(data: torch.Tensor, queries: torch.Tensor, k: int) -> list[list[int]]:
    """The true top-k rows of each query: float64 products on the CPU, outside every engine
    measured, so recall is against the truth and not against one of the engines. The rows go
    in blocks of ``BLOCK_ROWS`` with a running top-k, so its memory does not grow with N."""
    exact = queries.double().cpu()
    best_scores = torch.full((exact.shape[0], 0), float("-inf"), dtype=torch.float64)
    best_rows = torch.zeros((exact.shape[0], 0), dtype=torch.int64)
    for first in range(0, data.shape[0], BLOCK_ROWS):
        block = data[first : first + BLOCK_ROWS].double().cpu()
        scores = exact @ block.T
        top = scores.topk(min(k, block.shape[0]), dim=1)
        best_scores = torch.cat([best_scores, top.values], dim=1)
        best_rows = torch.cat([best_rows, top.indices + first], dim=1)
        keep = best_scores.topk(min(k, best_scores.shape[1]), dim=1).indices
        best_scores, best_rows = best_scores.gather(1, keep), best_rows.gather(1, keep)
    order = best_scores.argsort(dim=1, descending=True)
    return best_rows.gather(1, order).tolist()  # type: ignore[no-any-return]


def _rows_list(rows: Any) -> list[list[int]]:
    return (rows.cpu() if isinstance(rows, torch.Tensor) else torch.from_numpy(rows)).tolist()


def _our_engines(device: torch.device, data: torch.Tensor, mode: str) -> list[_Engine]:
    """gpucache's store in ``mode`` at the library's defaults (scan budget included) with the
    torch kernel; on CUDA with Triton also the fused kernel and the "auto" default (not for
    int8, which the Triton kernel does not read)."""
    from gpucache.kernels import triton_available

    variants = [("gpucache", "torch")]
    if device.type == "cuda" and triton_available() and mode != "int8":
        variants += [("gpucache-triton", "triton"), ("gpucache-auto", "auto")]
    engines = []
    n, dim = data.shape
    for label, kernel in variants:
        store = ExactScanStore(dim, device=device, quantization=mode, initial_rows=n, scan_kernel=kernel)
        for first in range(0, n, BLOCK_ROWS):  # written in blocks: no transient copy of the set
            block = data[first : first + BLOCK_ROWS]
            store.add(block, 0, [float("inf")] * block.shape[0])

        def search(queries: torch.Tensor, k: int, store: ExactScanStore = store) -> torch.Tensor:
            return store.search(queries, k, 0)[1]

        engines.append(_Engine(label, mode, search, store.row_bytes - 16, str(device), store))
    return engines


def _faiss_engines(data: torch.Tensor, mode: str) -> list[_Engine]:
    """FAISS's index of ``mode``'s precision (IndexFlatIP for fp32, the fp16 and 8-bit scalar
    quantizers; none for bf16) and, for the other modes, IndexFlatIP beside it as the
    yardstick; configured at their best. Empty where FAISS is not installed."""
    try:
        import faiss
    except ImportError:
        return []
    # faiss-cpu only switches to BLAS at Q >= 20 by default (distance_compute_blas_threshold);
    # below it a scalar loop runs. Compare against it at its best: BLAS for every batch size.
    faiss.cvar.distance_compute_blas_threshold = 1
    # FAISS's OpenMP pool gets the threads torch scans with, so neither side has more cores;
    # the report records both (machine.versions()).
    faiss.omp_set_num_threads(torch.get_num_threads())
    x = data.numpy()
    dim = x.shape[1]
    quantizers = {"fp16": faiss.ScalarQuantizer.QT_fp16, "int8": faiss.ScalarQuantizer.QT_8bit}
    indexes: list[tuple[str, Any, bool]] = []
    if mode in quantizers:
        indexes.append(
            (mode, faiss.IndexScalarQuantizer(dim, quantizers[mode], faiss.METRIC_INNER_PRODUCT), True)
        )
    indexes.append(("fp32", faiss.IndexFlatIP(dim), mode == "fp32"))
    engines = []
    for index_mode, index, reported in indexes:
        if not index.is_trained:
            index.train(x)
        for first in range(0, x.shape[0], BLOCK_ROWS):
            index.add(x[first : first + BLOCK_ROWS])

        def search(queries: Any, k: int, index: Any = index) -> Any:
            return index.search(queries, k)[1]

        bytes_per_row = {"fp32": 4 * dim, "fp16": 2 * dim, "int8": dim}[index_mode]
        engines.append(_Engine("faiss", index_mode, search, bytes_per_row, "cpu", reported=reported))
    return engines
