"""Faults, a clock that jumps, the bad-input matrix, threads under stress, and properties."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
import torch
from conftest import FakeEmbedder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucache import ContentPolicy, ExactScanStore, SemanticCache, StoreEverything, ThresholdOnly
from gpucache.index.engines.torch_engine import TorchEngine


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(embedder=None, **kwargs):
    kwargs.setdefault("verifier", ThresholdOnly())
    kwargs.setdefault("threshold", 0.8)
    kwargs.setdefault("device", "cpu")
    return SemanticCache(embedder or FakeEmbedder(), **kwargs)


# --------------------------------------------------------------------- faults


def test_a_batch_loader_failing_stores_nothing_from_that_batch_and_the_cache_stays_usable():
    cache = make()
    cache.put("kept", "k")

    def loader(missed):
        if "poison" in missed:
            raise RuntimeError("model failed on one prompt of the batch")
        return [m.upper() for m in missed]

    with pytest.raises(RuntimeError, match="one prompt of the batch"):
        cache.get_or_put_all(["fine one", "poison", "fine two"], loader)
    assert len(cache) == 1  # all or nothing: "fine one" was not half-written
    assert cache.get_or_put_all(["fine one", "fine two"], loader) == ["FINE ONE", "FINE TWO"]
    assert len(cache) == 3


class OomEngine:
    """The torch engine, out of device memory for chunks larger than ``fits`` rows (or always,
    with ``fits=0``). The store's CPU fallback scans with its own CPU engine, which never
    raises."""

    name = "oom"

    def __init__(self, fits: int = 0) -> None:
        self.fits = fits
        self.inner = TorchEngine()

    def scan(self, rows, job, buffer):
        if job.chunk > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return self.inner.scan(rows, job, buffer)


def test_out_of_memory_retries_in_smaller_chunks():
    store = ExactScanStore(8, device="cpu", scan_budget_bytes=4 * 4096, engine=OomEngine(fits=512))
    vectors = torch.nn.functional.normalize(torch.randn(3000, 8), dim=1)
    store.add(vectors, 0, [float("inf")] * 3000)
    scores, rows = store.search(vectors[:1], 1, 0)
    # 3000 rows in one chunk, then 1500, 750, 375: three retries
    assert rows.item() == 0 and store.scan_retries == 3 and store.cpu_fallbacks == 0


def test_out_of_memory_falls_back_to_the_cpu_with_a_warning_and_a_count(fake_embedder):
    cache = make(fake_embedder, engine=OomEngine(fits=0))
    cache.warm([("alpha beta", "a"), ("gamma delta", "g")])
    with pytest.warns(RuntimeWarning, match="ran out of memory"):
        hit = cache.get("Alpha beta!")
    assert hit is not None and hit.response == "a"
    stats = cache.stats()
    assert stats.cpu_fallbacks == 1 and stats.scan_retries == 0


def test_a_clock_stepped_back_does_not_resurrect_expired_entries():
    clock = Clock()
    cache = make(timer=clock, ttl=10)
    cache.put("q", "a")
    clock.now += 11
    assert cache.get("q") is None
    cache.put("semantic one", "s")
    clock.now += 11
    assert cache.get("unrelated words") is None  # traffic: the cache sees the time pass
    clock.now -= 1000  # then the wall clock is stepped back by NTP
    assert cache.get("Semantic one?") is None and cache.get("q") is None


def test_a_clock_stepped_back_does_not_expire_fresh_entries():
    clock = Clock()
    cache = make(timer=clock, ttl=10)
    clock.now -= 500
    cache.put("fresh", "f")
    clock.now += 5
    assert cache.get("fresh").response == "f"


# --------------------------------------------------------------------- bad-input matrix

BAD_PROMPTS = [
    (None, TypeError),
    (b"bytes", TypeError),
    (42, TypeError),
    (3.5, TypeError),
    (["a list"], TypeError),
    ("", ValueError),
    ("   ", ValueError),
    ("\n\t\r", ValueError),
]


def _entry_points(cache, bad):
    loop = asyncio.new_event_loop()
    try:
        yield "get", lambda: cache.get(bad)
        yield "get_all", lambda: cache.get_all(["ok", bad])
        yield "put", lambda: cache.put(bad, "r")
        yield "warm", lambda: cache.warm([("ok", "r"), (bad, "r")])
        yield "get_or_put", lambda: cache.get_or_put(bad, lambda p: "r")
        yield "get_or_put_all", lambda: cache.get_or_put_all(["ok", bad], lambda ms: ms)
        yield "get_or_put_streaming", lambda: cache.get_or_put_streaming(bad, lambda p: ["r"])
        yield "invalidate", lambda: cache.invalidate(bad)
        yield "aget", lambda: loop.run_until_complete(cache.aget(bad))
        yield "aget_all", lambda: loop.run_until_complete(cache.aget_all([bad]))
        yield "aget_or_put", lambda: loop.run_until_complete(cache.aget_or_put(bad, _async_const("r")))
        yield "aget_or_put_all", lambda: loop.run_until_complete(cache.aget_or_put_all([bad], _async_list))
        yield "aget_or_put_streaming", lambda: cache.aget_or_put_streaming(bad, lambda p: ["r"])
    finally:
        loop.close()


async def _async_list(ms):
    return list(ms)


def _async_const(value):
    async def loader(prompt):
        return value

    return loader


def _state(cache):
    return (len(cache), cache.stats(), sorted(e.prompt for e in cache._core.table))


@pytest.mark.parametrize("bad, error", BAD_PROMPTS, ids=[repr(b) for b, _ in BAD_PROMPTS])
def test_every_entry_point_rejects_bad_prompts_and_changes_nothing(bad, error):
    cache = make()
    cache.put("kept", "k")
    before = _state(cache)
    for name, call in _entry_points(cache, bad):
        with pytest.raises(error):
            call()
        assert _state(cache) == before, name


@pytest.mark.parametrize("bad", [None, b"x", 1, ["x"], {"a": 1}])
def test_bad_responses_and_loader_results_are_type_errors(bad):
    cache = make()
    with pytest.raises(TypeError):
        cache.put("q", bad)
    with pytest.raises(TypeError):
        cache.get_or_put("q", lambda p: bad)
    with pytest.raises(TypeError):
        cache.warm([("q", bad)])
    with pytest.raises(TypeError):
        asyncio.run(cache.aget_or_put("q", _async_const(bad)))
    assert len(cache) == 0


@pytest.mark.parametrize(
    "bad, error",
    [
        (0, ValueError),
        (-1, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        ("10", TypeError),
        (True, TypeError),
    ],
)
def test_bad_ttls(bad, error):
    cache = make()
    with pytest.raises(error):
        cache.put("q", "a", ttl=bad)
    with pytest.raises(error):
        make(ttl=bad)
    assert len(cache) == 0


@pytest.mark.parametrize("bad", [1, b"s", ["s"], object()])
def test_bad_scopes_everywhere(bad):
    cache = make()
    for call in (
        lambda: cache.get("q", scope=bad),
        lambda: cache.put("q", "a", scope=bad),
        lambda: cache.get_or_put("q", lambda p: "a", scope=bad),
        lambda: cache.get_or_put_all(["q"], lambda ms: ms, scope=bad),
        lambda: cache.warm([("q", "a")], scope=bad),
        lambda: cache.clear(scope=bad),
    ):
        with pytest.raises(TypeError, match="scope"):
            call()
    assert len(cache) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"threshold": 0},
        {"threshold": 1.5},
        {"top_k": 0},
        {"capacity": -3},
        {"replay_chunk_chars": 0},
        {"scan_budget_bytes": 0},
    ],
)
def test_sizes_and_thresholds_out_of_range(kwargs):
    with pytest.raises(ValueError):
        make(**kwargs)


@pytest.mark.parametrize(
    "prompt",
    [
        "NUL\x00inside",
        "emoji 🙂🚀 prompt",
        "right-to-left مرحبا بالعالم",
        "mixed Ελληνικά и русский 中文",
        "lone surrogate \ud800 here",
        "\u200b zero width",
        "a" * 10_000,
    ],
    ids=["nul", "emoji", "rtl", "mixed", "surrogate", "zero-width", "long-word"],
)
def test_unusual_text_is_stored_and_found_exactly(prompt, real_embedder):
    cache = SemanticCache(real_embedder, device="cpu")
    assert cache.put(prompt, "answer") is True
    hit = cache.get(prompt)
    assert hit is not None and hit.exact and hit.response == "answer"
    assert cache.get_or_put(prompt, lambda p: "never") == "answer"


# prompts past the default policy's 200,000 characters are not stored (ContentPolicy): these
# tests let them in, scanned whole, to show what the cache does with one
LONG_PROMPTS = {"cache_policy": ContentPolicy(max_prompt_chars=2_000_000, max_scan_chars=2_000_000)}


def test_a_one_megabyte_prompt_is_embedded_truncated_and_found_exactly(real_embedder):
    cache = SemanticCache(real_embedder, device="cpu", **LONG_PROMPTS)
    big = "word " * 200_000  # 1 MB
    cache.put(big, "big answer")
    hit = cache.get(big)
    assert hit.exact and hit.response == "big answer"


def test_a_question_added_past_the_embedders_window_is_not_served_the_answer(real_embedder):
    """The same first 256 tokens and a different tail: the embedder sees the same text
    (similarity 1.0), so only the verifier, comparing in full, can tell them apart; the tail
    names a language only one prompt asks for."""
    cache = SemanticCache(real_embedder, device="cpu", **LONG_PROMPTS)
    big = "word " * 200_000
    cache.put(big, "big answer")
    assert cache.get(big + " and then translate the summary into French") is None
    assert cache.stats().rejections == {"entity": 1}


def test_a_100k_prompt_batch_goes_through_in_one_call():
    embedder = FakeEmbedder(dim=16)
    cache = make(embedder, cache_policy=StoreEverything(), capacity=200_000)
    prompts = [f"p{i}" for i in range(100_000)]
    out = cache.get_or_put_all(prompts, lambda ms: [m[::-1] for m in ms])
    assert out[:3] == ["0p", "1p", "2p"] and len(cache) == 100_000 and embedder.calls == 1


def test_huge_responses_are_refused_by_the_default_policy_not_by_a_crash():
    cache = make()
    assert cache.put("q", "x" * 5_000_000) is False
    assert cache.stats().refusals == {"too-large": 1}
    assert make(cache_policy=StoreEverything()).put("q", "x" * 5_000_000) is True


# --------------------------------------------------------------------- threads


@pytest.mark.slow
def test_threads_under_stress_keep_the_invariants():
    cache = make(capacity=150, cache_policy=StoreEverything())
    scopes = ["a", "b", "c"]
    words = [f"w{i}" for i in range(60)]
    errors: list[BaseException] = []

    def loader_one(prompt):
        return f"answer:{prompt}"

    def loader_many(missed):
        assert len(set(missed)) == len(missed)  # distinct misses only
        return [f"answer:{m}" for m in missed]

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(600):
                scope = rng.choice(scopes)
                prompt = " ".join(rng.sample(words, 2))
                op = rng.random()
                if op < 0.25:
                    hit = cache.get(prompt, scope=scope)
                    assert hit is None or hit.response.startswith("answer:")
                elif op < 0.35:
                    cache.get_all([prompt, rng.choice(words)], scope=scope)
                elif op < 0.5:
                    cache.put(prompt, f"answer:{prompt}", scope=scope)
                elif op < 0.7:
                    cache.get_or_put(prompt, loader_one, scope=scope)
                elif op < 0.9:
                    batch = [" ".join(rng.sample(words, 2)) for _ in range(5)]
                    out = cache.get_or_put_all(batch, loader_many, scope=scope)
                    assert len(out) == 5
                elif op < 0.97:
                    cache.invalidate(prompt, scope=scope)
                else:
                    cache.clear(scope)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "deadlock: a worker did not finish"
    assert errors == []
    stats = cache.stats()
    assert stats.entries == len(cache) <= cache.capacity
    assert stats.hits == stats.exact_hits + stats.semantic_hits
    assert len(cache._core.flights) == 0  # no claim left behind
    for entry in list(cache._core.table):  # every stored entry is found by an exact get
        hit = cache.get(entry.prompt, scope=entry.scope)
        assert hit is not None and hit.exact and hit.response == entry.response


@pytest.mark.slow
def test_tasks_under_stress_keep_the_invariants():
    cache = make(capacity=100, cache_policy=StoreEverything())
    calls: dict[str, int] = {}

    async def loader(prompt):
        calls[prompt] = calls.get(prompt, 0) + 1
        await asyncio.sleep(0.001)  # stall: a model's time, so that tasks interleave
        return f"answer:{prompt}"

    async def main():
        rng = random.Random(1)
        prompts = [f"topic {i}" for i in range(40)]
        jobs = [cache.aget_or_put(rng.choice(prompts), loader) for _ in range(2000)]
        results = await asyncio.wait_for(asyncio.gather(*jobs), timeout=120)
        return results

    results = asyncio.run(main())
    assert all(r.startswith("answer:") for r in results)
    assert all(n == 1 for n in calls.values())  # 40 distinct prompts fit: each loaded once
    assert len(cache) == len(calls) <= 100 and len(cache._core.flights) == 0


# --------------------------------------------------------------------- properties

ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "get_or_put", "invalidate", "clear"]),
        st.sampled_from(["s1", "s2", "s3"]),
        st.sampled_from(["red apple", "green pear", "red apples", "blue sky", "apple red"]),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_no_cross_scope_hit_ever(sequence):
    cache = make(threshold=0.5, cache_policy=StoreEverything())
    model: dict[str, dict[str, str]] = {"s1": {}, "s2": {}, "s3": {}}
    for op, scope, prompt in sequence:
        if op == "put":
            cache.put(prompt, f"{scope}:{prompt}", scope=scope)
            model[scope][prompt] = f"{scope}:{prompt}"
        elif op == "get":
            hit = cache.get(prompt, scope=scope)
            if prompt in model[scope]:  # stored here: always found, exactly
                assert hit is not None and hit.exact and hit.response == model[scope][prompt]
            elif hit is not None:  # a semantic hit: only ever an entry of this scope
                assert model[scope].get(hit.cached_prompt) == hit.response
        elif op == "get_or_put":
            answer = cache.get_or_put(prompt, lambda p, s=scope: f"{s}:{p}", scope=scope)
            assert answer.startswith(f"{scope}:")  # loaded here, or another entry of this scope
            assert answer in model[scope].values() or answer == f"{scope}:{prompt}"
            if prompt not in model[scope] and answer == f"{scope}:{prompt}":
                model[scope][prompt] = answer  # a miss: loaded and stored
        elif op == "invalidate":
            cache.invalidate(prompt, scope=scope)
            model[scope].pop(prompt, None)
        else:
            cache.clear(scope)
            model[scope].clear()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([f"word{i}" for i in range(12)]), max_size=25),
    st.lists(st.sampled_from([f"word{i}" for i in range(12)]), max_size=6),
)
def test_a_batch_loads_exactly_what_sequential_calls_would_miss(prompts, stored):
    """Prompts here are single distinct words, dissimilar to each other, so whether one
    prompt is answered cannot depend on another of the batch being stored first."""
    batch_cache, seq_cache = make(), make()
    for cache in (batch_cache, seq_cache):
        cache.warm([(w, f"stored:{w}") for w in stored])
    batch_calls: list[list[str]] = []
    batch_cache.get_or_put_all(prompts, lambda ms: batch_calls.append(list(ms)) or list(ms))
    seq_missed: list[str] = []
    for p in prompts:
        seq_cache.get_or_put(p, lambda x: seq_missed.append(x) or x)
    assert (batch_calls[0] if batch_calls else []) == seq_missed
    assert len(batch_calls) <= 1


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.text(min_size=1, max_size=20).filter(str.strip),
            st.text(max_size=20),
        ),
        max_size=15,
    )
)
def test_save_then_load_answers_every_lookup_as_before(tmp_path_factory, items):
    embedder = FakeEmbedder()
    cache = make(embedder, cache_policy=StoreEverything())
    for scope, prompt, response in items:
        cache.put(prompt, response, scope=scope)
    path = tmp_path_factory.mktemp("snap") / "c"
    cache.save(path)
    loaded = SemanticCache.load(path, embedder=embedder, device="cpu", verifier=ThresholdOnly())
    for scope, prompt, _ in items:
        assert loaded.get(prompt, scope=scope) == cache.get(prompt, scope=scope)
    assert len(loaded) == len(cache)


def test_a_quantized_stores_cpu_fallback_scans_its_exact_copy():
    """A half-precision store that runs out of device memory falls back to its fp32 host copy:
    exact scores, where multiplying the half-precision rows on the CPU would be slow and coarse."""
    gen = torch.Generator().manual_seed(3)
    vectors = torch.nn.functional.normalize(torch.randn(500, 16, generator=gen), dim=1)
    queries = vectors[:4] + 0.05
    store = ExactScanStore(16, device="cpu", quantization="fp16", engine=OomEngine(fits=0))
    store.add(vectors, 0, [float("inf")] * 500)
    with pytest.warns(RuntimeWarning, match="ran out of memory"):
        scores, rows = store.search(queries, 3, 0)
    want = (queries @ vectors.T).topk(3, dim=1)
    torch.testing.assert_close(scores, want.values, rtol=0, atol=1e-6)
    assert torch.equal(rows, want.indices) and store.cpu_fallbacks >= 1
