"""The speed benchmark's cells: the embedder, the scan beside FAISS, a cache end to end, the
latency and the overhead of a get (bench/speed.py runs them and writes the report)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from speed_timing import sync, timed_together

from gpucache.index.kernel_choice import bucket, size_class
from gpucache.index.store import ExactScanStore


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


def bench_embedder(device: torch.device, prompts: list[str], repeat: int) -> dict[str, Any]:
    """Our embedder against sentence-transformers on the same model and prompts, and against
    itself in plain fp32 where the default took a faster dtype: all timed together
    (``timed_together``), so the ratios do not carry a shared machine's drift between them."""
    from gpucache.embedding.embedder import TransformerEmbedder
    from gpucache.embedding.model import default_model_path

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
        engines["sentence_transformers"] = lambda: st.encode(prompts, batch_size=64, convert_to_tensor=True)
    timings = dict(zip(engines, timed_together(list(engines.values()), device, repeat)))
    seconds, spread = timings["gpucache"]
    result: dict[str, Any] = {
        "prompts": len(prompts),
        "gpucache_prompts_per_s": len(prompts) / seconds,
        "gpucache_spread_s": spread,
        "dtype": str(ours.dtype)
        + (f", matmuls in {ours.autocast_dtype} (autocast)" if ours.autocast_dtype else ""),
    }
    if exact is not None:
        result["fp32_prompts_per_s"] = len(prompts) / timings["fp32"][0]
        result["min_cosine_vs_fp32"] = float((exact.encode(prompts) * ours.encode(prompts)).sum(dim=1).min())
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


@dataclass
class _Engine:
    label: str  # "gpucache", "gpucache-triton", "gpucache-auto", "faiss"
    mode: str
    search: Callable[[Any, int], Any]  # (queries, k) -> rows (Q, K) as a tensor or array
    bytes_per_row: int
    device: str
    store: ExactScanStore | None = None


def bench_scan(
    device: torch.device,
    ns: list[int],
    qs: list[int],
    modes: list[str],
    k: int,
    repeat: int,
    dim: int = 384,
    telemetry: list[dict[str, Any]] | None = None,
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
                functools.partial(e.search, on_host if e.label == "faiss" else on_device, k) for e in engines
            ]
            # The machine's read bandwidth moved from 15.7 to 53.5 GB/s within one session on
            # a shared machine, so a figure from minutes before could make a memory-bound scan
            # look twice as good or bad: at Q = 1 a plain read of the same rows is timed with
            # the engines, and the fraction is of that.
            read: list[Callable[[], Any]] = [functools.partial(torch.sum, data.to(device))] if q == 1 else []
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
                    )
                )
            if telemetry is not None and device.type == "cuda":
                from gpucache.telemetry import gpu_readings

                telemetry += [{"n": n, "q": q, "mode": "all", **asdict(r)} for r in gpu_readings()[:1]]
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
        store = ExactScanStore(
            dim, device=device, quantization=mode, initial_rows=n, scan_kernel=kernel
        )  # the library's default scan budget
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
    from gpucache.demo.replay import load_workload
    from gpucache.embedding.embedder import TransformerEmbedder

    prompts = [item.prompt for item in load_workload()]
    embedder = TransformerEmbedder(device=device)
    times = []
    for _ in range(repeat):
        cache = SemanticCache(embedder, device=device)
        start = time.perf_counter()
        for i in range(0, len(prompts), 32):
            cache.get_or_put_all(prompts[i : i + 32], lambda ms: [f"answer: {m}" for m in ms])
        sync(device)
        times.append(time.perf_counter() - start)
    stats = cache.stats()
    seconds = statistics.median(times)
    return {
        "prompts": len(prompts),
        "seconds": seconds,
        "prompts_per_s": len(prompts) / seconds,
        "hit_rate": stats.hit_rate,
    }


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
        sync(self.device)
        self.embed_s = time.perf_counter() - start
        return vectors  # type: ignore[no-any-return]


NEAR_PER_PROMPT = 2  # stored entries near each prompt of the overhead batch


def _kind(hit: Any) -> str:
    """What a lookup came to: "miss", "exact" or "semantic"."""
    return "miss" if hit is None else "exact" if hit.exact else "semantic"


def _looked_up(cache: Any, prompt: str) -> str:
    """A get-or-load call with an instant loader (``get_or_put``'s cost), and what its lookup
    came to."""
    from gpucache import Found, Keep

    served = cache.get_or_load(prompt, lambda p: Keep("fresh"))
    return _kind(served.hit if isinstance(served, Found) else None)


def bench_latency(device: torch.device, n: int, count: int) -> dict[str, Any]:
    """One lookup at a time, as a proxy at low concurrency sees it: p50 and p99 milliseconds
    of ``get`` of a new prompt (a miss), ``get_or_put`` of a reworded stored prompt (a semantic
    hit) and of a new prompt (a miss, the loader instant), over a cache of ``n`` entries at the
    default settings; beside them sentence-transformers encoding one prompt, the yardstick.

    The four are measured in rounds, one call of each per round, so a shared machine's drift
    reaches them alike; the ratios to the yardstick are of medians from the same rounds."""
    from gpucache import SemanticCache, StoreEverything
    from gpucache.demo.replay import load_workload
    from gpucache.embedding.embedder import TransformerEmbedder

    router = _FillRouter(TransformerEmbedder(device=device))
    base = list(dict.fromkeys(item.prompt for item in load_workload()))[: count + 1]
    if len(base) <= count:
        raise ValueError(f"the demo workload has {len(base)} distinct prompts; ask for fewer")

    def filled(**settings: Any) -> SemanticCache:
        cache = SemanticCache(
            router,
            device=device,
            capacity=n + 4 * count + 10,  # type: ignore[arg-type]
            cache_policy=StoreEverything(),
            **settings,
        )
        cache.warm([(p, "stored answer") for p in base])
        for first in range(0, n - len(base), 50_000):
            cache.warm(
                [(f"{router.prefix}{i}", "x") for i in range(first, min(n - len(base), first + 50_000))]
            )
        return cache

    cache = filled()
    # the same lookup from a full-precision store, beside the default's storage mode
    fp32 = filled(quantization="fp32") if cache.quantization != "fp32" else None
    # each cache call returns what the cache did ("miss", "exact", "semantic"), so the report
    # says how many calls of a row were what the row is named for, counted row by row
    calls: dict[str, Callable[[int], object]] = {
        "get (miss)": lambda i: _kind(cache.get(f"{base[i]} (asked {i})")),
        "get_or_put (semantic hit)": lambda i: _looked_up(cache, f"Please, {base[i]}"),
        "get_or_put (miss)": lambda i: _looked_up(cache, f"{base[i]} (new {i})"),
        "gpucache embedder encode, batch 1": lambda i: router.real.encode([f"{base[i]} (e {i})"]),
    }
    if fp32 is not None:
        calls["get (miss), fp32 store"] = lambda i: _kind(fp32.get(f"{base[i]} (fp32 {i})"))
    for call in calls.values():  # warm-up (first calls allocate), on a prompt of its own
        call(count)
    millis: dict[str, list[float]] = {name: [] for name in calls}
    outcomes: dict[str, dict[str, int]] = {}
    for i in range(count):
        for name, call in calls.items():
            start = time.perf_counter()
            outcome = call(i)
            sync(device)
            millis[name].append(1000 * (time.perf_counter() - start))
            if isinstance(outcome, str):
                row = outcomes.setdefault(name, {"miss": 0, "exact": 0, "semantic": 0})
                row[outcome] += 1
    embedder = router.real
    out: dict[str, Any] = {
        "n": n,
        "count": count,
        "outcomes": outcomes,
        "quantization": cache.quantization,
        "embedder": {
            "lean": embedder.uses_lean,
            "packed": embedder.packed,
            "single_text_path": embedder.single_text_path,
        },
        "ms": {},
    }
    for name, values in millis.items():
        values.sort()
        out["ms"][name] = {
            "p50": statistics.median(values),
            "p99": values[min(len(values) - 1, (99 * len(values)) // 100)],
        }
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
    from gpucache.demo.replay import load_workload
    from gpucache.embedding.embedder import TransformerEmbedder

    router = _FillRouter(TransformerEmbedder(device=device))
    cache = SemanticCache(
        router,
        device=device,
        capacity=n + 10_000,  # type: ignore[arg-type]
        cache_policy=StoreEverything(),
        quantization=quantization,
    )
    base = list(dict.fromkeys(item.prompt for item in load_workload()))[:64]
    # Beside the random fill, entries near every prompt of the batch ("(stored 0)" beside
    # "(variant 1)"): the scan finds them above the threshold, so the verifier runs on each
    # lookup as it does in real traffic (and, the numbers differing, refuses them).
    near = [(f"{p} (stored {j})", "x") for p in base for j in range(NEAR_PER_PROMPT)]
    cache.warm(near)
    for first in range(0, n - len(near), 50_000):
        cache.warm([(f"{router.prefix}{i}", "x") for i in range(first, min(n - len(near), first + 50_000))])
    scope_id = cache.scope_id()  # the default scope the fill went to
    if scope_id is None:
        raise RuntimeError("gpucache bug: the fill stored nothing in the default scope")
    runs: list[tuple[float, float, float]] = []  # (embed, scan, get_or_put_all) per run
    refused_before = sum(cache.stats().rejections.values())
    for run in range(repeat + 1):
        batch = [f"{p} (variant {run})" for p in base]  # new text each run: no exact-tier hits
        vectors = router.real.encode(batch)
        start = time.perf_counter()
        cache.store.search(vectors, cache.top_k, scope_id)
        sync(device)
        scan = time.perf_counter() - start
        router.real.encode(batch)  # the scan below meets the cores as get_or_put_all's does
        start = time.perf_counter()
        cache.get_or_put_all(batch, lambda ms: ["answer"] * len(ms))
        sync(device)
        total = time.perf_counter() - start
        if run:  # the first run warms up
            runs.append((router.embed_s, scan, total))
    # The fractions are taken per run, then the median (not a ratio of medians), so a
    # neighbour's load on one run moves that run's numerator and denominator together.
    verified = sum(cache.stats().rejections.values()) - refused_before
    return {
        "n": n,
        "batch": len(base),
        "quantization": quantization or "fp32",
        "verifier_rejections_per_batch": verified / (repeat + 1),
        "embed_s": statistics.median(e for e, _, _ in runs),
        "scan_s": statistics.median(sc for _, sc, _ in runs),
        "get_or_put_all_s": statistics.median(t for _, _, t in runs),
        "overhead_fraction": statistics.median((t - e) / e for e, _, t in runs),
        "scan_fraction": statistics.median(sc / e for e, sc, _ in runs),
        "runs": len(runs),
    }
