"""The cache cells: ``get_or_put_all`` end to end on the demo workload, one lookup at a time
(p50 and p99 of ``get`` and ``get_or_put``, hit and miss), and the cache's own work per batch
beside the embedding it waits on."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpucache.benchmark.timing import sync


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

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
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
    yardstick = _sentence_transformers(device)
    if yardstick is not None:  # the yardstick: what embedding the prompt alone costs elsewhere
        calls["sentence-transformers encode, batch 1"] = lambda i: yardstick.encode(
            [f"{base[i]} (st {i})"], convert_to_tensor=True
        )
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


def _sentence_transformers(device: torch.device) -> Any:
    """sentence-transformers on the packaged model and ``device``, or None where it is not
    installed (the report then has no yardstick column)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    from gpucache.embedding.model import default_model_path

    return SentenceTransformer(str(default_model_path()), device=str(device))


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
