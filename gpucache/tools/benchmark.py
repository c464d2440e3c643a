"""``gpucache bench``: the same work on every available device, beside the tools a user would
pick instead, measured in one run.

What it measures (medians of ``repeat`` synchronized timings after a warm-up):

* machine limits: memory read bandwidth (a large ``sum``) and dense matmul rate per dtype, so
  every scan figure is also a fraction of what the machine can do;
* the embedder: prompts/s of ``TransformerEmbedder`` against sentence-transformers on the same
  prompts and model, with the cosine agreement between the two;
* the scan: queries/s and effective GB/s of ``ExactScanStore.search`` for each N x Q x storage
  mode at the library's default scan budget, with recall@K against a float64 brute force,
  against FAISS ``IndexFlatIP`` and against FAISS's index of the same precision (scalar
  quantizers fp16, 8-bit), configured at their best (BLAS for every batch size, the same
  thread count as torch) where faiss is installed;
* ``get_or_put_all`` end to end on the demo workload (paraphrase-heavy);
* on CUDA, NVML telemetry (memory used, utilisation, power) read during the scan runs.

Data are seeded random unit vectors (the scan's cost does not depend on their meaning).

Why one module of this length: it is one report, and its parts (the timing harness, the
engines compared, the report renderer) change together when a measurement does; it is a tool
run by the command line, never imported by the library.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpucache.devices import cpu_features
from gpucache.index.blas_pool import blas_pool_quiet
from gpucache.index.interface import QUANTIZATIONS
from gpucache.index.kernel_choice import bucket, size_class
from gpucache.index.probes import CpuPaths
from gpucache.index.store import ExactScanStore


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeat: int) -> tuple[float, float]:
    """Median and spread (max - min) seconds of ``fn`` over ``repeat`` runs, after a warm-up."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), max(times) - min(times)


@dataclass
class ScanResult:
    device: str
    engine: str  # "gpucache" or "faiss"
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


@dataclass
class BenchReport:
    device: str
    versions: dict[str, str]
    read_gb_per_s: float
    matmul_tflops: dict[str, float]
    embed: dict[str, Any] = field(default_factory=dict)
    scans: list[ScanResult] = field(default_factory=list)
    end_to_end: dict[str, Any] = field(default_factory=dict)
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    limits_measured: dict[str, dict[str, float]] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)


def read_bandwidth(device: torch.device, repeat: int, megabytes: int = 1024) -> float:
    """GB/s of reading a large fp32 tensor once (a reduction: one read, almost no writes)."""
    x = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    seconds, _ = timed(lambda: x.sum(), device, repeat)
    return x.numel() * 4 / seconds / 1e9


def matmul_rate(device: torch.device, dtype: torch.dtype, repeat: int, size: int) -> float:
    """TFLOP/s (TOP/s for int8) of a square matmul in ``dtype``: the faster of torch's and, for
    fp32 on a CPU, numpy's BLAS (the one the fp32 scan uses on AMD CPUs, where it beat torch's
    MKL). int8 goes through torch._int_mm (int8 x int8 -> int32), the product of the CPU's int8
    scan."""
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (size, size), dtype=torch.int8, device=device)
        b = torch.randint(-127, 128, (size, size), dtype=torch.int8, device=device)
        seconds, _ = timed(lambda: torch._int_mm(a, b), device, repeat)
        return 2 * size**3 / seconds / 1e12
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    seconds, _ = timed(lambda: a @ b, device, repeat)
    if device.type == "cpu" and dtype == torch.float32:
        a_np, b_np = a.numpy(), b.numpy()
        seconds = min(seconds, timed(lambda: a_np @ b_np, device, repeat)[0])
    return 2 * size**3 / seconds / 1e12


def bench_embedder(device: torch.device, prompts: list[str], repeat: int) -> dict[str, Any]:
    """Our embedder against sentence-transformers on the same model and prompts, and against
    itself in plain fp32 where the default took a faster dtype: all timed together
    (``timed_together``), so the ratios do not carry a shared machine's drift between them."""
    from gpucache.embedding.embedder import TransformerEmbedder, default_model_path

    ours = TransformerEmbedder(device=device)
    engines: dict[str, Callable[[], Any]] = {"gpucache": lambda: ours.encode(prompts)}
    exact = None
    if ours.autocast_dtype is not None:  # the default took a faster path: what it costs
        exact = TransformerEmbedder(device=device, dtype=torch.float32)
        engines["fp32"] = lambda: exact.encode(prompts)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        st = None
    else:
        st = SentenceTransformer(str(default_model_path()), device=str(device))
        engines["sentence_transformers"] = lambda: st.encode(
            prompts, batch_size=64, convert_to_tensor=True
        )
    timings = dict(zip(engines, timed_together(list(engines.values()), device, repeat)))
    seconds, spread = timings["gpucache"]
    result: dict[str, Any] = {
        "prompts": len(prompts),
        "gpucache_prompts_per_s": len(prompts) / seconds,
        "gpucache_spread_s": spread,
        "dtype": str(ours.dtype) + (
            f", matmuls in {ours.autocast_dtype} (autocast)" if ours.autocast_dtype else ""
        ),
    }
    if exact is not None:
        result["fp32_prompts_per_s"] = len(prompts) / timings["fp32"][0]
        result["min_cosine_vs_fp32"] = float(
            (exact.encode(prompts) * ours.encode(prompts)).sum(dim=1).min()
        )
        result["probe_min_cosine_vs_fp32"] = ours.agreement
    if st is None:
        result["sentence_transformers"] = "not installed"
        return result
    st_seconds, st_spread = timings["sentence_transformers"]
    theirs = st.encode(prompts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
    cosine = (ours.encode(prompts) * theirs.float().to(device)).sum(dim=1)
    result.update(
        sentence_transformers_prompts_per_s=len(prompts) / st_seconds,
        sentence_transformers_spread_s=st_spread,
        speedup=st_seconds / seconds,
        min_cosine=float(cosine.min()),
    )
    return result


BLOCK_SECONDS = 0.2
BLOCK_RUNS = 50


def timed_together(
    fns: Sequence[Callable[[], object]], device: torch.device, repeat: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[float, float]]:
    """``timed`` for several functions compared with each other: each is timed in a block
    right after the others (seconds apart, where timing all N and Q of one engine before the
    next had let minutes of a shared machine's drift decide the comparison), in forward order
    then in reverse order, so a load that rises or falls through the measurement falls on
    every engine alike. Each block starts with an untimed run: the engines use different
    thread pools (torch's OpenMP, numpy's BLAS, FAISS's OpenMP), and a pool that has just
    worked keeps spinning on the cores for a while (interleaved run by run, FAISS's fp32
    Q = 64 search took 29 ms instead of 4).
    """
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for runs, indices in (((repeat + 1) // 2, order), (repeat // 2, order[::-1])):
        if runs == 0:
            continue
        for i in indices:
            fns[i]()  # settles the thread pools this engine uses
            _sync(device)
            spent, done = 0.0, 0
            # fast cases run until the block has taken BLOCK_SECONDS (up to BLOCK_RUNS runs):
            # a median of 3 runs of a 1 ms search is mostly the machine's noise
            while done < runs or (spent < BLOCK_SECONDS and done < BLOCK_RUNS):
                start = clock()
                fns[i]()
                _sync(device)
                times[i].append(clock() - start)
                spent += times[i][-1]
                done += 1
    return [(statistics.median(t), max(t) - min(t)) for t in times]


@dataclass
class _Engine:
    label: str  # "gpucache", "gpucache-triton", "gpucache-auto", "faiss"
    mode: str
    search: Callable[[Any, int], Any]  # (queries, k) -> rows (Q, K) as a tensor or array
    bytes_per_row: int
    device: str
    store: ExactScanStore | None = None


def bench_scan(
    device: torch.device, ns: list[int], qs: list[int], modes: list[str], k: int, repeat: int,
    dim: int = 384, telemetry: list[dict[str, Any]] | None = None,
) -> list[ScanResult]:
    """Every engine on the same data and queries; for each (N, Q) the engines are timed
    together (``timed_together``) and recall is against a float64 brute force."""
    results: list[ScanResult] = []
    gen = torch.Generator().manual_seed(0)
    for n in ns:
        data = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen), dim=1)
        queries_all = torch.nn.functional.normalize(
            data[torch.randint(0, n, (max(qs),), generator=gen)]
            + 0.2 * torch.randn(max(qs), dim, generator=gen),
            dim=1,
        )
        engines = _our_engines(device, data, modes) + _faiss_engines(data)
        for q in qs:
            queries = queries_all[:q]
            on_device, on_host = queries.to(device), queries.numpy()
            calls: list[Callable[[], Any]] = [
                functools.partial(e.search, on_host if e.label == "faiss" else on_device, k)
                for e in engines
            ]
            # The machine's read bandwidth moved from 15.7 to 53.5 GB/s within one session on
            # a shared machine, so a figure from minutes before could make a memory-bound scan
            # look twice as good or bad: at Q = 1 a plain read of the same rows is timed with
            # the engines, and the fraction is of that.
            read: list[Callable[[], Any]] = (
                [functools.partial(torch.sum, data.to(device))] if q == 1 else []
            )
            for engine, call in zip(engines, calls):  # an auto store measures its kernels first
                chooser = engine.store.kernel_chooser if engine.store is not None else None
                if chooser is not None:
                    call()
                    chooser.wait_measured()
            timings = timed_together(calls + read, device, repeat)
            read_gb_per_s = data.numel() * 4 / timings.pop()[0] / 1e9 if read else None
            del read
            reference = brute_force_top_k(data, queries, k)
            for engine, call, (seconds, spread) in zip(engines, calls, timings):
                rows = _rows_list(call())
                recall = sum(len(set(a) & set(b)) for a, b in zip(rows, reference)) / (q * k)
                label = engine.label
                chooser = engine.store.kernel_chooser if engine.store is not None else None
                if chooser is not None:  # say which kernel the default chose
                    label += ":" + chooser.choices.get((bucket(q), size_class(n)), "torch")
                results.append(ScanResult(
                    engine.device, label, engine.mode, n, q, seconds, spread, q / seconds,
                    n * engine.bytes_per_row / seconds / 1e9, recall, read_gb_per_s,
                ))
            if telemetry is not None and device.type == "cuda":
                from gpucache.telemetry import gpu_readings

                telemetry += [{"n": n, "q": q, "mode": "all", **asdict(r)}
                              for r in gpu_readings()[:1]]
        del engines
    return results


def brute_force_top_k(data: torch.Tensor, queries: torch.Tensor, k: int) -> list[list[int]]:
    """The true top-k rows of each query: float64 products on the CPU, outside every engine
    measured, so recall is against the truth and not against one of the engines."""
    scores = queries.double().cpu() @ data.double().cpu().T
    return scores.topk(k, dim=1).indices.tolist()  # type: ignore[no-any-return]


def _rows_list(rows: Any) -> list[list[int]]:
    return (rows.cpu() if isinstance(rows, torch.Tensor) else torch.from_numpy(rows)).tolist()


def _our_engines(device: torch.device, data: torch.Tensor, modes: list[str]) -> list[_Engine]:
    """gpucache stores at the library's defaults (scan budget included), fp32 with the torch
    kernel first; on CUDA with Triton also the fused kernel and the "auto" default per mode."""
    from gpucache.kernels import triton_available

    variants = [("gpucache", mode, "torch") for mode in sorted(modes, key=lambda m: m != "fp32")]
    if device.type == "cuda" and triton_available():
        variants += [("gpucache-triton", m, "triton") for m in modes if m != "int8"]
        variants += [("gpucache-auto", m, "auto") for m in modes if m != "int8"]
    engines = []
    n, dim = data.shape
    for label, mode, kernel in variants:
        store = ExactScanStore(dim, device=device, quantization=mode, initial_rows=n,
                               scan_kernel=kernel)  # the library's default scan budget
        store.add(data, 0, [float("inf")] * n)

        def search(queries: torch.Tensor, k: int, store: ExactScanStore = store) -> torch.Tensor:
            return store.search(queries, k, 0)[1]

        engines.append(_Engine(label, mode, search, store.row_bytes - 16, str(device), store))
    return engines


def _faiss_engines(data: torch.Tensor) -> list[_Engine]:
    """FAISS IndexFlatIP and its fp16 / int8 scalar quantizers, configured at their best."""
    try:
        import faiss
    except ImportError:
        return []
    # faiss-cpu only switches to BLAS at Q >= 20 by default (distance_compute_blas_threshold);
    # below it a scalar loop runs. Compare against it at its best: BLAS for every batch size.
    faiss.cvar.distance_compute_blas_threshold = 1
    # FAISS's OpenMP pool gets the threads torch scans with, so neither side has more cores;
    # the report records both (versions()).
    faiss.omp_set_num_threads(torch.get_num_threads())
    x = data.numpy()
    dim = x.shape[1]
    indexes: list[tuple[str, Any]] = [("fp32", faiss.IndexFlatIP(dim))]
    for name, qtype in (("fp16", faiss.ScalarQuantizer.QT_fp16), ("int8", faiss.ScalarQuantizer.QT_8bit)):
        indexes.append((name, faiss.IndexScalarQuantizer(dim, qtype, faiss.METRIC_INNER_PRODUCT)))
    engines = []
    for mode, index in indexes:
        if not index.is_trained:
            index.train(x)
        index.add(x)

        def search(queries: Any, k: int, index: Any = index) -> Any:
            return index.search(queries, k)[1]

        bytes_per_row = {"fp32": 4 * dim, "fp16": 2 * dim, "int8": dim}[mode]
        engines.append(_Engine("faiss", mode, search, bytes_per_row, "cpu"))
    return engines


def bench_end_to_end(device: torch.device, repeat: int) -> dict[str, Any]:
    from gpucache import SemanticCache
    from gpucache.embedding.embedder import TransformerEmbedder
    from gpucache.tools.demo import load_workload

    prompts = [item.prompt for item in load_workload()]
    embedder = TransformerEmbedder(device=device)
    times = []
    for _ in range(repeat):
        cache = SemanticCache(embedder, device=device)
        start = time.perf_counter()
        for i in range(0, len(prompts), 32):
            cache.get_or_put_all(prompts[i : i + 32], lambda ms: [f"answer: {m}" for m in ms])
        _sync(device)
        times.append(time.perf_counter() - start)
    stats = cache.stats()
    seconds = statistics.median(times)
    return {"prompts": len(prompts), "seconds": seconds, "prompts_per_s": len(prompts) / seconds,
            "hit_rate": stats.hit_rate}


class _FillRouter:
    """The real embedder for real prompts; seeded random unit vectors for synthetic fill
    prompts, so a store of N entries can be built in seconds to measure the lookup path."""

    prefix = "\x00fill "

    def __init__(self, real: Any) -> None:
        self.real = real
        self.name = real.name
        self._gen = torch.Generator().manual_seed(7)
        self.embed_s = 0.0  # seconds the real embedder took in its latest call

    @property
    def dim(self) -> int:
        return int(self.real.dim)

    @property
    def device(self) -> torch.device:
        return self.real.device  # type: ignore[no-any-return]

    def encode(self, texts: list[str]) -> torch.Tensor:
        if texts and all(t.startswith(self.prefix) for t in texts):
            rand = torch.randn(len(texts), self.dim, generator=self._gen)
            return torch.nn.functional.normalize(rand, dim=1).to(self.device)
        start = time.perf_counter()
        vectors = self.real.encode(texts)
        _sync(self.device)
        self.embed_s = time.perf_counter() - start
        return vectors  # type: ignore[no-any-return]


NEAR_PER_PROMPT = 2  # stored entries near each prompt of the overhead batch


def bench_latency(device: torch.device, n: int, count: int) -> dict[str, Any]:
    """One lookup at a time, as a proxy at low concurrency sees it: p50 and p99 milliseconds
    of ``get`` of a new prompt (a miss), ``get_or_put`` of a reworded stored prompt (a semantic
    hit) and of a new prompt (a miss, the loader instant), over a cache of ``n`` entries at the
    default settings; beside them sentence-transformers encoding one prompt, the yardstick.

    The four are measured in rounds, one call of each per round, so a shared machine's drift
    reaches them alike; the ratios to the yardstick are of medians from the same rounds."""
    from gpucache import SemanticCache, StoreEverything
    from gpucache.embedding.embedder import TransformerEmbedder, default_model_path
    from gpucache.tools.demo import load_workload

    router = _FillRouter(TransformerEmbedder(device=device))
    base = list(dict.fromkeys(item.prompt for item in load_workload()))[: count + 1]
    if len(base) <= count:
        raise ValueError(f"the demo workload has {len(base)} distinct prompts; ask for fewer")

    def filled(**settings: Any) -> SemanticCache:
        cache = SemanticCache(router, device=device, capacity=n + 4 * count + 10,  # type: ignore[arg-type]
                              cache_policy=StoreEverything(), **settings)
        cache.warm([(p, "stored answer") for p in base])
        for first in range(0, n - len(base), 50_000):
            cache.warm([(f"{router.prefix}{i}", "x")
                        for i in range(first, min(n - len(base), first + 50_000))])
        return cache

    cache = filled()
    # the same lookup from a full-precision store, beside the default's storage mode
    fp32 = filled(quantization="fp32") if cache.quantization != "fp32" else None
    calls: dict[str, Callable[[int], object]] = {
        "get (miss)": lambda i: cache.get(f"{base[i]} (asked {i})"),
        "get_or_put (semantic hit)": lambda i: cache.get_or_put(f"Please, {base[i]}",
                                                               lambda p: "fresh"),
        "get_or_put (miss)": lambda i: cache.get_or_put(f"{base[i]} (new {i})", lambda p: "fresh"),
        "gpucache embedder encode, batch 1": lambda i: router.real.encode([f"{base[i]} (e {i})"]),
    }
    if fp32 is not None:
        calls["get (miss), fp32 store"] = lambda i: fp32.get(f"{base[i]} (fp32 {i})")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        pass
    else:
        st = SentenceTransformer(str(default_model_path()), device=str(device))
        calls["sentence-transformers encode, batch 1"] = (
            lambda i: st.encode([f"{base[i]} (st {i})"], convert_to_tensor=True))
    for call in calls.values():  # warm-up (first calls allocate), on a prompt of its own
        call(count)
    millis: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(count):
        for name, call in calls.items():
            start = time.perf_counter()
            call(i)
            _sync(device)
            millis[name].append(1000 * (time.perf_counter() - start))
    served = cache.stats()
    embedder = router.real
    lean = getattr(embedder, "_lean", None)
    out: dict[str, Any] = {"n": n, "count": count, "semantic_hits": served.semantic_hits,
                           "quantization": cache.quantization,
                           "embedder": {"lean": bool(getattr(embedder, "uses_lean", False)),
                                        "packed": bool(lean is not None and lean.packed),
                                        "single_text_path": getattr(embedder, "_single", None)
                                        is not None},
                           "ms": {}}
    for name, values in millis.items():
        values.sort()
        out["ms"][name] = {"p50": statistics.median(values),
                           "p99": values[min(len(values) - 1, (99 * len(values)) // 100)]}
    return out


def bench_overhead(
    device: torch.device, n: int, repeat: int, quantization: str | None = None
) -> dict[str, Any]:
    """get_or_put_all on a cache of ``n`` entries, minus the embedding of its batch and its
    (instant) loader: the cache's own work per batch, as a fraction of the embedding time.

    The embedding is timed inside the same get_or_put_all call (the embedder it calls is
    wrapped), so the overhead is that call's own remainder: an embedding timed in a separate
    call moved by 10-30% from run to run on a shared machine, more than the overhead itself.
    The scan is also timed alone, right after an embedding, as the call meets it."""
    from gpucache import SemanticCache, StoreEverything
    from gpucache.cache.validation import check_scope
    from gpucache.embedding.embedder import TransformerEmbedder
    from gpucache.tools.demo import load_workload

    router = _FillRouter(TransformerEmbedder(device=device))
    cache = SemanticCache(router, device=device, capacity=n + 10_000,  # type: ignore[arg-type]
                          cache_policy=StoreEverything(), quantization=quantization)
    base = list(dict.fromkeys(item.prompt for item in load_workload()))[:64]
    # Beside the random fill, entries near every prompt of the batch ("(stored 0)" beside
    # "(variant 1)"): the scan finds them above the threshold, so the verifier runs on each
    # lookup as it does in real traffic (and, the numbers differing, refuses them).
    near = [(f"{p} (stored {j})", "x") for p in base for j in range(NEAR_PER_PROMPT)]
    cache.warm(near)
    for first in range(0, n - len(near), 50_000):
        cache.warm([(f"{router.prefix}{i}", "x")
                    for i in range(first, min(n - len(near), first + 50_000))])
    scope_id = cache.core.table.scope_id(check_scope(None))  # the default scope the fill went to
    if scope_id is None:
        raise RuntimeError("gpucache bug: the fill stored nothing in the default scope")
    runs: list[tuple[float, float, float]] = []  # (embed, scan, get_or_put_all) per run
    refused_before = sum(cache.stats().rejections.values())
    for run in range(repeat + 1):
        batch = [f"{p} (variant {run})" for p in base]  # new text each run: no exact-tier hits
        vectors = router.real.encode(batch)
        start = time.perf_counter()
        cache.store.search(vectors, cache.top_k, scope_id)
        _sync(device)
        scan = time.perf_counter() - start
        router.real.encode(batch)  # the scan below meets the cores as get_or_put_all's does
        start = time.perf_counter()
        cache.get_or_put_all(batch, lambda ms: ["answer"] * len(ms))
        _sync(device)
        total = time.perf_counter() - start
        if run:  # the first run warms up
            runs.append((router.embed_s, scan, total))
    # The fractions are taken per run, then the median (not a ratio of medians), so a
    # neighbour's load on one run moves that run's numerator and denominator together.
    verified = sum(cache.stats().rejections.values()) - refused_before
    return {"n": n, "batch": len(base), "quantization": quantization or "fp32",
            "verifier_rejections_per_batch": verified / (repeat + 1),
            "embed_s": statistics.median(e for e, _, _ in runs),
            "scan_s": statistics.median(sc for _, sc, _ in runs),
            "get_or_put_all_s": statistics.median(t for _, _, t in runs),
            "overhead_fraction": statistics.median((t - e) / e for e, _, t in runs),
            "scan_fraction": statistics.median(sc / e for e, sc, _ in runs),
            "runs": len(runs)}


def versions() -> dict[str, str]:
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "cuda": str(torch.version.cuda),
           "machine": platform.machine(), "processor": platform.processor() or "unknown",
           "cpu_threads": str(torch.get_num_threads()),
           "cpu_features": " ".join(cpu_features()) or "no AVX2",
           "blas_pool": "quiet" if blas_pool_quiet() else "spinning",
           "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT", "unset"),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset")}
    try:
        import faiss

        out["faiss"] = faiss.__version__
        out["faiss_threads"] = str(faiss.omp_get_max_threads())
    except ImportError:
        out["faiss"] = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    out["commit"] = commit or "unknown"
    return out


def machine_limits(device: torch.device, repeat: int, quick: bool) -> tuple[float, dict[str, float]]:
    """Read bandwidth (GB/s) and dense matmul rate per dtype (TFLOP/s) of ``device`` now.

    int8 is measured only where the store multiplies in int8 (a CPU with torch._int_mm); a
    CUDA store widens int8 rows to fp32, so fp32 is its int8 roofline."""
    dtypes = [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
    if device.type == "cpu" and CpuPaths.detect().int8_matmul:
        dtypes.append(("int8", torch.int8))
    return read_bandwidth(device, repeat, 256 if quick else 1024), {
        name: matmul_rate(device, dtype, repeat, 512 if quick else 2048) for name, dtype in dtypes
    }


def _latency_lines(latency: dict[str, Any]) -> list[str]:
    if not latency:
        return []
    yardstick = latency["ms"].get("sentence-transformers encode, batch 1")
    how = latency.get("embedder", {})
    lines = ["### One lookup at a time", "",
             f"A cache of {latency['n']:,} entries at the default settings (storage "
             f"`{latency.get('quantization', 'fp32')}`; embedder: lean pass "
             f"{'on' if how.get('lean') else 'off'}, packed weights "
             f"{'on' if how.get('packed') else 'off'}, single-text path "
             f"{'on' if how.get('single_text_path') else 'off'}), {latency['count']} "
             "calls of each kind, one at a time, interleaved in rounds (semantic hits served: "
             f"{latency['semantic_hits']}).", "",
             "| call | p50 ms | p99 ms | p50 / sentence-transformers batch-1 p50 |",
             "|---|---:|---:|---:|"]
    for name, ms in latency["ms"].items():
        ratio = f"{ms['p50'] / yardstick['p50']:.2f}x" if yardstick else "-"
        lines.append(f"| {name} | {ms['p50']:.2f} | {ms['p99']:.2f} | {ratio} |")
    return lines + [""]


def _limits_spread(r: BenchReport) -> str:
    if not r.limits_measured:
        return ""
    start, end = r.limits_measured["start"], r.limits_measured["end"]
    return (f"; start {start['read_gb_per_s']:.1f} GB/s and fp32 {1000 * start['fp32']:.0f} "
            f"GFLOP/s, end {end['read_gb_per_s']:.1f} GB/s and {1000 * end['fp32']:.0f} GFLOP/s")


def run_bench(
    devices: list[torch.device], *, quick: bool, repeat: int
) -> list[BenchReport]:
    from gpucache.tools.demo import load_workload

    ns = [10_000] if quick else [10_000, 100_000, 1_000_000]
    qs = [1, 64] if quick else [1, 64, 1024]
    prompts = [item.prompt for item in load_workload()][: 64 if quick else 304]
    reports = []
    for device in devices:
        telemetry: list[dict[str, Any]] = []
        bandwidth, rates = machine_limits(device, repeat, quick)
        report = BenchReport(
            device=str(device), versions=versions(), read_gb_per_s=bandwidth, matmul_tflops=rates
        )
        report.embed = bench_embedder(device, prompts, repeat)
        report.scans = bench_scan(device, ns, qs, list(QUANTIZATIONS), 4, repeat,
                                  telemetry=telemetry)
        report.latency = bench_latency(device, 10_000 if quick else 100_000, 20 if quick else 200)
        report.end_to_end = bench_end_to_end(device, 1 if quick else repeat)
        report.end_to_end["overhead"] = [
            bench_overhead(device, 10_000 if quick else 100_000, 1 if quick else repeat, mode)
            for mode in (None, "bf16", "int8")
        ]
        # On a shared machine the limits move with the neighbours' load: measured again at the
        # end, and the higher of the two (what the machine can do) is what fractions are of.
        bandwidth_end, rates_end = machine_limits(device, repeat, quick)
        report.limits_measured = {"start": {"read_gb_per_s": bandwidth, **rates},
                                  "end": {"read_gb_per_s": bandwidth_end, **rates_end}}
        report.read_gb_per_s = max(bandwidth, bandwidth_end)
        report.matmul_tflops = {name: max(rates[name], rates_end[name]) for name in rates}
        report.telemetry = telemetry
        reports.append(report)
    return reports


def render(reports: list[BenchReport], command: str) -> str:
    lines = ["# gpucache bench", "", f"Reproduce: `{command}`", ""]
    for r in reports:
        v = r.versions
        lines += [
            f"## {r.device}", "",
            f"Commit {v['commit']}; Python {v['python']}, torch {v['torch']} (CUDA {v['cuda']}), "
            f"transformers {v['transformers']}, faiss {v['faiss']}; {v['machine']}"
            + (f" ({v['cpu_features']})" if "cpu_features" in v else "")
            + f", {v['cpu_threads']} torch threads"
            + (f", numpy's BLAS pool {v['blas_pool']} when idle" if "blas_pool" in v else "")
            + (f"; FAISS's OpenMP pool set to {v['faiss_threads']} threads"
               if "faiss_threads" in v else "")
            + (f"; OPENBLAS_THREAD_TIMEOUT {v['openblas_thread_timeout']}, OMP_NUM_THREADS "
               f"{v['omp_num_threads']}" if "omp_num_threads" in v else "")
            + ".", "",
            f"Machine limits measured in this run (the higher of a measurement at its start and "
            f"one at its end{_limits_spread(r)}): read bandwidth {r.read_gb_per_s:.1f} GB/s; "
            "dense matmul " + ", ".join(
                f"{k} {1000 * t:.1f} {'GOP/s' if k == 'int8' else 'GFLOP/s'}"
                for k, t in r.matmul_tflops.items()
            )
            + ".", "",
            "### Embedder", "",
        ]
        e = r.embed
        lines.append(f"{e['prompts']} prompts: gpucache {e['gpucache_prompts_per_s']:.0f} prompts/s "
                     f"({e['dtype']})" + (
                         f"; sentence-transformers {e['sentence_transformers_prompts_per_s']:.0f} "
                         f"prompts/s; ratio {e['speedup']:.2f}x; min cosine agreement "
                         f"{e['min_cosine']:.6f}." if "speedup" in e else "."))
        if "fp32_prompts_per_s" in e:
            lines.append(f"\nThe same embedder all in fp32: {e['fp32_prompts_per_s']:.0f} prompts/s; "
                         f"min cosine of the default against it {e['min_cosine_vs_fp32']:.6f} "
                         f"(load-time probe check: {e['probe_min_cosine_vs_fp32']:.6f}).")
        lines += ["", "### Scan (top-4, D = 384)", "",
                  "GB/s = bytes the mode stores for N rows / seconds per batch; fraction = of "
                  "the read bandwidth (Q = 1: of a plain sum over the same N rows in fp32, "
                  "timed together with the engines, given in the column 'read GB/s'; rows that fit in "
                  "the CPU's caches are read at cache speed there) or of the "
                  "faster of the mode's and fp32's matmul rate (Q >= 64, 2QND FLOPs).", "",
                  "| engine | mode | N | Q | ms / batch (spread) | queries/s | GB/s | read GB/s | "
                  "fraction | recall@4 | vs FAISS flat | vs FAISS same precision |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        flat = {(s.n, s.q): s.queries_per_s for s in r.scans if s.engine == "faiss" and s.mode == "fp32"}
        same = {(s.n, s.q, s.mode): s.queries_per_s for s in r.scans if s.engine == "faiss"}
        behind = []
        for s in r.scans:
            if s.q == 1:
                frac = s.gb_per_s / (s.read_gb_per_s or r.read_gb_per_s)
            else:
                # the roofline: the faster of the mode's own matmul and fp32 (CUDA widens int8
                # rows to fp32 and measures no int8 rate; CPU fp16 matmuls can be far slower
                # than fp32 ones, and a CPU fp16 batch scans the fp32 copy)
                rate = max(r.matmul_tflops.get(s.mode, 0.0), r.matmul_tflops.get("fp32", 0.0))
                frac = (2 * s.q * s.n * 384 / s.seconds / 1e12) / rate if rate else 0.0
            recall = "-" if s.recall_at_k is None else f"{s.recall_at_k:.4f}"
            versus = "-"
            if s.engine.startswith("gpucache") and (s.n, s.q) in flat:
                ratio = s.queries_per_s / flat[(s.n, s.q)]
                versus = f"{ratio:.2f}x"
                if ratio < 1:
                    behind.append(f"{s.engine} {s.mode} N={s.n} Q={s.q} ({ratio:.3f}x)")
            twin = same.get((s.n, s.q, s.mode)) if s.engine.startswith("gpucache") else None
            versus_same = f"{s.queries_per_s / twin:.2f}x" if twin else "-"
            read = "-" if s.read_gb_per_s is None else f"{s.read_gb_per_s:.1f}"
            lines.append(f"| {s.engine} | {s.mode} | {s.n} | {s.q} | {1000 * s.seconds:.2f} "
                         f"({1000 * s.spread:.2f}) | {s.queries_per_s:.0f} | {s.gb_per_s:.1f} | "
                         f"{read} | {frac:.0%} | {recall} | {versus} | {versus_same} |")
        lines += ["", "recall@4 is against the true top 4: float64 products on the CPU, outside "
                  "every engine measured. 'vs FAISS flat' divides by FAISS IndexFlatIP (fp32); "
                  "'vs FAISS same precision' by FAISS's index of the mode's precision (fp32: "
                  "IndexFlatIP, fp16: IndexScalarQuantizer QT_fp16, int8: QT_8bit). gpucache's "
                  "stores run at the library's default scan budget."
                  + (" The ratios are of a GPU against FAISS on the CPU (faiss-gpu is not "
                     "installed)." if r.device.startswith("cuda") else "")]
        if flat:
            lines += ["", "Engines timed together for each (N, Q), in blocks, forward then "
                      "reverse order, so the ratios hold on a busy machine. Below FAISS "
                      "IndexFlatIP: "
                      + ("; ".join(behind) if behind else "none") + "."]
        ee = r.end_to_end
        lines += ["", "### get_or_put_all end to end", "",
                  f"{ee['prompts']} demo prompts in batches of 32 (embed, scan, verify, store; "
                  f"instant loader): {ee['seconds']:.2f} s, {ee['prompts_per_s']:.0f} prompts/s, "
                  f"hit rate {ee['hit_rate']:.1%}.", ""]
        overheads = ee.get("overhead", [])
        for o in [overheads] if isinstance(overheads, dict) else overheads:  # old reports: one
            near = (f", {o['verifier_rejections_per_batch']:.0f} candidates per batch above "
                    "the threshold refused by the verifier (entries stored near every prompt)"
                    if "verifier_rejections_per_batch" in o else "")
            lines += [f"Cache overhead at N = {o['n']} stored entries (synthetic vectors{near}, "
                      f"{o.get('quantization', 'fp32')} storage), batches "
                      f"of {o['batch']} new demo prompts: embedding {1000 * o['embed_s']:.0f} ms "
                      "(timed inside the call), "
                      f"get_or_put_all {1000 * o['get_or_put_all_s']:.0f} ms, overhead beyond "
                      f"embedding and the (instant) loader {o['overhead_fraction']:.1%} of the "
                      "embedding time (median of per-run fractions)"
                      + (f", of which the similarity scan alone {o['scan_fraction']:.1%} "
                         f"({1000 * o['scan_s']:.0f} ms)" if "scan_fraction" in o else "")
                      + ".", ""]
        lines += _latency_lines(r.latency)
        if r.telemetry:
            lines += ["### NVML telemetry during the scans", "",
                      "| N | Q | mode | memory used GiB | utilisation | power W |",
                      "|---:|---:|---|---:|---:|---:|"]
            for t in r.telemetry:
                lines.append(f"| {t['n']} | {t['q']} | {t['mode']} | "
                             f"{t['memory_used_bytes'] / 2**30:.1f} | {t['utilization_percent']} | "
                             f"{t['power_watts']} |")
            lines.append("")
    if len(reports) > 1:
        cpu = next(r for r in reports if r.device == "cpu")
        lines += ["## GPU vs CPU (same run)", "", "| measure | ratio |", "|---|---:|"]
        for r in reports:
            if r is cpu:
                continue
            lines.append(f"| embed prompts/s, {r.device} / cpu | "
                         f"{r.embed['gpucache_prompts_per_s'] / cpu.embed['gpucache_prompts_per_s']:.1f}x |")
            lines.append(f"| get_or_put_all prompts/s, {r.device} / cpu | "
                         f"{r.end_to_end['prompts_per_s'] / cpu.end_to_end['prompts_per_s']:.1f}x |")
            on_cpu = {(s.mode, s.n, s.q): s.queries_per_s for s in cpu.scans if s.engine == "gpucache"}
            largest = max((s.n for s in r.scans), default=0)
            for s in r.scans:
                if s.engine == "gpucache" and s.n == largest and (s.mode, s.n, s.q) in on_cpu:
                    lines.append(f"| scan queries/s, {s.mode}, N = {s.n}, Q = {s.q}, {r.device} / "
                                 f"cpu | {s.queries_per_s / on_cpu[(s.mode, s.n, s.q)]:.1f}x |")
        lines.append("")
    return "\n".join(lines)


def write(reports: list[BenchReport], out: Path, command: str) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(reports, command), encoding="utf-8")
    written = [out]
    data = out.with_suffix(".json")
    data.write_text(json.dumps([asdict(r) for r in reports], indent=1), encoding="utf-8")
    written.append(data)
    from gpucache.tools.plotting import headless_pyplot

    plt = headless_pyplot()
    if plt is None:
        return written
    fig, axes = plt.subplots(1, len(reports), figsize=(6 * len(reports), 4), squeeze=False)
    for ax, r in zip(axes[0], reports):
        q_max = max(s.q for s in r.scans)
        for engine, mode in sorted({(s.engine, s.mode) for s in r.scans}):
            pts = sorted((s.n, s.queries_per_s) for s in r.scans
                         if s.engine == engine and s.mode == mode and s.q == q_max)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if engine == "gpucache" else "s--",
                    label=f"{engine} {mode}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("stored rows N")
        ax.set_ylabel("queries/s (largest Q)")
        ax.set_title(f"scan on {r.device}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    written.append(png)
    return written


def load_reports(path: Path) -> list[BenchReport]:
    """Reports from a ``bench.json`` written by ``write`` (to re-render without re-running)."""
    reports = []
    for doc in json.loads(path.read_text(encoding="utf-8")):
        doc["scans"] = [ScanResult(**scan) for scan in doc["scans"]]
        reports.append(BenchReport(**doc))
    return reports
