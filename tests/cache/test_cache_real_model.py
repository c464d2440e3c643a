"""What depends on meaning, through the real all-MiniLM-L6-v2 model."""

from __future__ import annotations

import pytest

from gpucache import SemanticCache


@pytest.fixture
def cache(real_embedder):
    cache = SemanticCache(real_embedder, device="cpu")
    cache.warm(
        [
            ("How do I reset my password?", "Settings > Security > Reset password."),
            ("What is the capital of France?", "Paris."),
            ("How do I reverse a list in Python?", "Use lst.reverse() or lst[::-1]."),
        ]
    )
    return cache


@pytest.mark.parametrize(
    "paraphrase, answer",
    [
        ("How can I reset my password?", "Settings > Security > Reset password."),
        ("Tell me the capital of France, please.", "Paris."),
        ("How can I reverse a Python list?", "Use lst.reverse() or lst[::-1]."),
    ],
)
def test_paraphrases_are_served(cache, paraphrase, answer):
    hit = cache.get(paraphrase)
    assert hit is not None and hit.response == answer and not hit.exact
    assert cache.threshold <= hit.similarity < 1.0


@pytest.mark.parametrize(
    "unrelated", ["Recommend a science fiction novel", "Why is the sky blue?", "Set an alarm for 7 am"]
)
def test_unrelated_prompts_miss(cache, unrelated):
    assert cache.get(unrelated) is None


def test_scopes_are_isolated_through_the_real_model(cache):
    assert cache.get("How can I reset my password?", scope="another-tenant") is None
    cache.put("How do I reset my password?", "tenant B's answer", scope="another-tenant")
    assert cache.get("How can I reset my password?", scope="another-tenant").response == ("tenant B's answer")
    assert cache.get("How can I reset my password?").response.startswith("Settings")


def test_get_or_put_all_serves_paraphrases_and_loads_the_rest(cache):
    loaded: list[list[str]] = []

    def loader(missed: list[str]) -> list[str]:
        loaded.append(missed)
        return [f"fresh: {m}" for m in missed]

    out = cache.get_or_put_all(
        ["Tell me the capital of France, please.", "Why is the sky blue?", "Why is the sky blue?"], loader
    )
    assert out == ["Paris.", "fresh: Why is the sky blue?", "fresh: Why is the sky blue?"]
    assert loaded == [["Why is the sky blue?"]]


@pytest.mark.parametrize(
    "cached, near_miss, rule",
    [
        ("Convert 10 miles to km", "Convert 10 km to miles", "direction"),
        ("How do I reset my password?", "How do I reset my username?", "substitution"),
        ("Set an alarm for 7 am", "Set an alarm for 8 am", "numbers"),
        ("How do I turn on dark mode?", "How do I turn off dark mode?", "antonym"),  # enable / disable
        ("How do I copy photos to my phone?", "How do I copy photos from my phone?", "polarity"),
    ],
)
def test_near_misses_above_the_threshold_are_refused_and_counted(real_embedder, cached, near_miss, rule):
    from gpucache import ThresholdOnly

    unguarded = SemanticCache(real_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.6)
    unguarded.put(cached, "answer")
    assert unguarded.get(near_miss) is not None  # similarity alone would serve it

    guarded = SemanticCache(real_embedder, device="cpu", threshold=0.6)
    guarded.put(cached, "answer")
    assert guarded.get(near_miss) is None
    assert guarded.stats().rejections == {rule: 1}


@pytest.mark.parametrize("mode", ["bf16", "int8", "auto"])
def test_quantized_storage_serves_what_fp32_serves(real_embedder, mode):
    """Quantized rows only choose candidates; the fp32 rescore decides. Through the real model,
    with enough entries that int8 rows share their block's scale with other prompts."""
    from gpucache.demo.replay import load_workload

    prompts = list(dict.fromkeys(item.prompt for item in load_workload()))
    entries, asks = prompts[::2], prompts[1::2]  # the demo's paraphrases fall on both sides
    caches = [SemanticCache(real_embedder, device="cpu", quantization=m) for m in (None, mode)]
    assert caches[0].quantization == "fp32" and caches[1].quantization in ("int8", mode)
    for cache in caches:
        cache.warm([(prompt, f"answer {i}") for i, prompt in enumerate(entries)])
    plain, quantized = (cache.get_all(asks) for cache in caches)
    assert [h and h.response for h in quantized] == [h and h.response for h in plain]
    for q, p in zip(quantized, plain):  # the same exact scores, summed in another order
        assert (q is None) == (p is None) and (q is None or abs(q.similarity - p.similarity) < 1e-6)
    hits = sum(h is not None for h in plain)
    assert 10 <= hits <= len(asks) - 10  # the comparison covers real hits and real misses
