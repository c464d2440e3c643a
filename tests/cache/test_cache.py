"""SemanticCache's contract, on a fast deterministic embedder (meaning is tested elsewhere,
through the real model)."""

from __future__ import annotations

import math
import threading

import pytest

from gpucache import CacheStats, Hit, SemanticCache, ThresholdOnly, Verdict


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class RejectWords:
    """A verifier that rejects a candidate whose cached prompt contains a given word."""

    name = "reject-words"

    def __init__(self, *words: str) -> None:
        self.words = words
        self.seen: list[tuple[str, str, float]] = []

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        self.seen.append((cached_prompt, new_prompt, similarity))
        return not any(w in cached_prompt for w in self.words)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(fake_embedder, clock, device) -> SemanticCache:
    """Threshold-only, so these tests see the cache logic alone; the default verifier has its
    own tests (test_lexical.py) and is tested through the cache with the real model."""
    return SemanticCache(fake_embedder, threshold=0.8, verifier=ThresholdOnly(), device=device, timer=clock)


# --------------------------------------------------------------------- construction


def test_collaborators_and_settings_stay_readable(fake_embedder, clock):
    verifier = RejectWords()
    cache = SemanticCache(
        fake_embedder,
        threshold=0.9,
        verifier=verifier,
        top_k=3,
        capacity=10,
        ttl=60,
        device="cpu",
        timer=clock,
    )
    assert cache.embedder is fake_embedder
    assert cache.verifier is verifier
    assert (cache.threshold, cache.top_k, cache.capacity, cache.ttl) == (0.9, 3, 10, 60.0)
    assert cache.timer is clock and str(cache.device) == "cpu"


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.01, float("nan")])
def test_threshold_outside_range_is_rejected_naming_the_range(fake_embedder, threshold):
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        SemanticCache(fake_embedder, threshold=threshold, device="cpu")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"top_k": 0}, ValueError),
        ({"capacity": 0}, ValueError),
        ({"capacity": 1.5}, TypeError),
        ({"ttl": 0}, ValueError),
        ({"ttl": -5}, ValueError),
        ({"ttl": "1h"}, TypeError),
        ({"device": "tpu"}, ValueError),
        ({"verifier": object()}, TypeError),
        ({"timer": 5}, TypeError),
        ({"cache_policy": object()}, TypeError),
        ({"admission": object()}, TypeError),
        ({"settings": {"threshold": 0.9}}, TypeError),
    ],
)
def test_bad_settings_raise(fake_embedder, kwargs, error):
    with pytest.raises(error):
        SemanticCache(fake_embedder, **kwargs)


def test_a_wrong_argument_is_said_before_the_model_is_loaded(monkeypatch):
    def no_model(**_: object) -> None:
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("gpucache.cache.semantic.TransformerEmbedder", no_model)
    with pytest.raises(TypeError, match="verifier"):
        SemanticCache(verifier=object(), device="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_k"):
        SemanticCache(top_k=0, device="cpu")


def test_an_object_that_is_not_an_embedder_is_refused():
    with pytest.raises(TypeError, match="embedder"):
        SemanticCache(embedder="all-MiniLM", device="cpu")  # type: ignore[arg-type]


# --------------------------------------------------------------------- reads


def test_empty_cache_misses(cache):
    assert cache.get("anything at all") is None
    assert cache.stats().misses == 1


def test_exact_repeat_is_answered_without_the_embedder(cache, fake_embedder):
    cache.put("what is the boiling point of water", "100 C")
    calls = fake_embedder.calls
    hit = cache.get("what is the boiling point of water")
    assert hit == Hit("100 C", "what is the boiling point of water", 1.0, exact=True)
    assert fake_embedder.calls == calls


def test_similar_prompt_is_served_with_its_similarity(cache):
    cache.put("what is the boiling point of water", "100 C")
    hit = cache.get("What is the boiling point of water?")  # same words, other case/punctuation
    assert hit is not None and not hit.exact
    assert hit.response == "100 C" and hit.cached_prompt == "what is the boiling point of water"
    assert hit.similarity == pytest.approx(1.0, abs=1e-5)


def test_dissimilar_prompt_misses(cache):
    cache.put("what is the boiling point of water", "100 C")
    assert cache.get("recommend a sci fi novel") is None


def test_threshold_per_call_overrides_the_default(cache):
    cache.put("alpha beta gamma delta", "x")
    # 3 of 4 words shared: cosine about 0.75 with the bag-of-words embedder
    assert cache.get("alpha beta gamma epsilon") is None
    assert cache.get("alpha beta gamma epsilon", threshold=0.5) is not None
    with pytest.raises(ValueError):
        cache.get("alpha beta gamma epsilon", threshold=2.0)


def test_get_all_runs_one_embedder_batch_and_keeps_input_order(cache, fake_embedder):
    cache.warm([("red apple", "A"), ("green pear", "P")])
    calls = fake_embedder.calls
    hits = cache.get_all(["green pear!", "blue sky", "red apple", "Red Apple"])
    assert [h.response if h else None for h in hits] == ["P", None, "A", "A"]
    assert [h.exact if h else None for h in hits] == [False, None, True, False]
    assert fake_embedder.calls == calls + 1
    stats = cache.stats()
    assert (stats.exact_hits, stats.semantic_hits, stats.misses) == (1, 2, 1)


def test_get_all_of_nothing_is_nothing(cache, fake_embedder):
    assert cache.get_all([]) == []
    assert fake_embedder.calls == 0


# --------------------------------------------------------------------- scopes


def test_scopes_never_see_each_other(cache):
    cache.put("summarise this contract", "tenant A's summary", scope="tenant-a")
    assert cache.get("summarise this contract", scope="tenant-b") is None
    assert cache.get("summarise this contract") is None  # the default scope is a scope too
    assert cache.get("Summarise this contract.", scope="tenant-b") is None
    assert cache.get("summarise this contract", scope="tenant-a").response == "tenant A's summary"


def test_same_prompt_in_two_scopes_keeps_two_answers(cache):
    cache.put("hello", "from a", scope="a")
    cache.put("hello", "from b", scope="b")
    assert cache.get("hello", scope="a").response == "from a"
    assert cache.get("hello!", scope="b").response == "from b"
    assert len(cache) == 2


# --------------------------------------------------------------------- verifier seam


def test_verifier_sees_candidates_and_can_reject(fake_embedder, clock):
    verifier = RejectWords("forbidden")
    cache = SemanticCache(fake_embedder, threshold=0.5, verifier=verifier, device="cpu", timer=clock)
    cache.put("forbidden question here", "no")
    assert cache.get("Forbidden question here?") is None
    assert verifier.seen and verifier.seen[0][:2] == ("forbidden question here", "Forbidden question here?")
    assert cache.stats().rejections == {"reject-words": 1}


def test_top_k_lets_the_next_candidate_through_after_a_rejection(fake_embedder, clock):
    verifier = RejectWords("forbidden")
    cache = SemanticCache(fake_embedder, threshold=0.5, verifier=verifier, top_k=2, device="cpu", timer=clock)
    cache.put("one two three forbidden", "bad")
    cache.put("one two three four five", "good")
    hit = cache.get("one two three forbidden five")
    assert hit is not None and hit.response == "good"
    one = SemanticCache(fake_embedder, threshold=0.5, verifier=verifier, top_k=1, device="cpu")
    one.put("one two three forbidden", "bad")
    one.put("one two three four five", "good")
    assert one.get("one two three forbidden five") is None


class CountingLock:
    """The cache's re-entrant lock, counting the sections taken on it."""

    def __init__(self) -> None:
        self.inner, self.sections = threading.RLock(), 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        taken = self.inner.acquire(blocking, timeout)
        self.sections += taken
        return taken

    def release(self) -> None:
        self.inner.release()

    def __enter__(self) -> CountingLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_repeat_asked_from_a_thread_takes_the_lock_once(fake_embedder):
    """The exact tier's shortcut serves the sync calls as it serves the event loop: a repeat is
    looked up (and, for a get-or-load call, claimed) in one lock section, not one for the exact
    tier, two around a scan it does not need and one for its claims."""
    cache = SemanticCache(fake_embedder, device="cpu")
    cache.put("what is the capital of france", "Paris.")
    lock = CountingLock()
    cache._core.lock = cache._core.lookup.lock = lock
    assert cache.get("what is the capital of france").exact and lock.sections == 1
    lock.sections = 0
    assert cache.get_or_put("what is the capital of france", lambda p: "never") == "Paris."
    assert lock.sections == 1
    lock.sections = 0
    assert cache.get("a prompt never stored") is None and lock.sections > 1  # the whole lookup ran
    assert cache.stats().exact_hits == 2 and cache.stats().misses == 1


def free_from_another_thread(lock) -> bool:
    """Whether another thread could take ``lock`` now (the caller's own hold counts)."""
    free: list[bool] = []

    def try_it():
        free.append(lock.acquire(blocking=False))
        if free[0]:
            lock.release()

    other = threading.Thread(target=try_it)
    other.start()
    other.join()
    return free[0]


class Meanwhile:
    """A verifier that, while it judges, runs ``during(cache)`` and asks from another thread
    whether the cache's lock is free: what another lookup, a store or a repeat would find."""

    name = "meanwhile"

    def __init__(self, during=lambda cache: None):
        self.during, self.cache, self.lock_free = during, None, []

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        self.lock_free.append(free_from_another_thread(self.cache._core.lock))
        self.during(self.cache)
        return True


def test_the_verifier_judges_without_the_caches_lock(fake_embedder):
    verifier = Meanwhile()
    cache = SemanticCache(fake_embedder, threshold=0.5, verifier=verifier, device="cpu")
    verifier.cache = cache
    cache.put("one two three four", "the answer")
    hit = cache.get("one two three four five")
    assert hit is not None and hit.response == "the answer"
    assert verifier.lock_free == [True]


class Watching:
    """A content policy that allows everything and records, at each decision, whether another
    thread could take the cache's lock then."""

    name = "watching"

    def __init__(self) -> None:
        self.cache: SemanticCache | None = None
        self.lock_free: list[bool] = []

    def decide(self, prompt, response, scope):
        from gpucache import PolicyDecision

        assert self.cache is not None
        self.lock_free.append(free_from_another_thread(self.cache._core.lock))
        return PolicyDecision(True)


@pytest.mark.parametrize(
    "write",
    [
        lambda cache: cache.put("alpha beta", "an answer"),
        lambda cache: cache.get_or_put("alpha beta", lambda p: "an answer"),
        lambda cache: cache.get_or_put_all(["alpha beta", "gamma delta"], lambda ps: ["one", "two"]),
        lambda cache: cache.may_store("alpha beta", "an answer"),
    ],
    ids=["put", "get_or_put", "get_or_put_all", "may_store"],
)
def test_the_content_policy_decides_without_the_caches_lock(fake_embedder, write):
    """Its regular expressions run over whole prompts and answers: under the lock, a long
    answer being checked would hold up every lookup."""
    policy = Watching()
    cache = SemanticCache(fake_embedder, device="cpu", cache_policy=policy)
    policy.cache = cache
    write(cache)
    assert policy.lock_free and all(policy.lock_free)


def test_admission_decides_without_the_caches_lock_and_its_deferrals_are_counted(fake_embedder):
    """Whether a loaded answer is admitted is a read of the sketch, asked before the lock is
    taken for the store: only the table's change and the counters are under it."""
    from gpucache import AdmissionPolicy

    class WatchingAdmission(AdmissionPolicy):
        lock_free: list[bool] = []

        def admits(self, scope, prompt):
            self.lock_free.append(free_from_another_thread(cache._core.lock))
            return super().admits(scope, prompt)

    admission = WatchingAdmission(min_sightings=2)
    cache = SemanticCache(fake_embedder, device="cpu", admission=admission)
    assert cache.get_or_put("alpha beta", lambda p: "first") == "first"  # seen once: deferred
    assert cache.get("alpha beta") is None and cache.stats().admissions_deferred == 1
    assert cache.get_or_put("alpha beta", lambda p: "second") == "second"  # its second sighting
    assert cache.get("alpha beta").response == "second" and cache.stats().admissions_deferred == 1
    assert admission.lock_free == [True, True]


@pytest.mark.parametrize(
    "change",
    [lambda cache: cache.invalidate("one two three four"), lambda cache: cache.clear()],
    ids=["invalidated", "cleared"],
)
def test_an_entry_removed_while_the_verifier_judges_it_is_not_served(fake_embedder, change):
    verifier = Meanwhile(during=change)
    cache = SemanticCache(fake_embedder, threshold=0.5, verifier=verifier, device="cpu")
    verifier.cache = cache
    cache.put("one two three four", "the answer")
    assert cache.get("one two three four five") is None  # a miss, never the answer that is gone
    verifier.during = lambda cache: None
    assert cache.get_or_put("one two three four five", lambda p: "loaded") == "loaded"


def test_an_answer_replaced_while_the_verifier_judges_its_prompt_is_served_as_it_is_now(fake_embedder):
    """The verifier judges the cached prompt, which a new answer for it does not change."""
    verifier = Meanwhile(during=lambda cache: cache.put("one two three four", "a newer answer"))
    cache = SemanticCache(fake_embedder, threshold=0.5, verifier=verifier, device="cpu")
    verifier.cache = cache
    cache.put("one two three four", "the answer")
    assert cache.get("one two three four five").response == "a newer answer"


def test_candidates_below_threshold_never_reach_the_verifier(fake_embedder):
    verifier = RejectWords()
    cache = SemanticCache(fake_embedder, threshold=0.99, verifier=verifier, top_k=4, device="cpu")
    cache.put("alpha beta", "x")
    assert cache.get("alpha gamma") is None
    assert verifier.seen == []


def test_the_default_verifier_is_the_lexical_guard(fake_embedder):
    from gpucache import LexicalNearMissVerifier

    assert isinstance(SemanticCache(fake_embedder, device="cpu").verifier, LexicalNearMissVerifier)


def test_threshold_only_serves_whatever_passes_the_threshold():
    assert ThresholdOnly().verify("to", "from", 0.9) is True
    assert ThresholdOnly().name == "threshold-only"
    assert ThresholdOnly().explain("to", "from") == Verdict(False, "threshold-only")  # accepted, by name


# --------------------------------------------------------------------- writes


def test_put_replaces_the_answer_for_the_same_prompt(cache):
    assert cache.put("q", "first") is True
    assert cache.put("q", "second") is True
    assert cache.get("q").response == "second"
    assert len(cache) == 1


def test_warm_stores_pairs_with_one_embedder_call(cache, fake_embedder):
    n = cache.warm([("a one", "1"), ("b two", "2"), ("a one", "1b")])
    assert n == 2 and fake_embedder.calls == 1
    assert cache.get("a one").response == "1b"


def test_warm_with_a_bad_pair_stores_nothing(cache):
    with pytest.raises(TypeError):
        cache.warm([("fine", "ok"), ("bad", 3)])
    with pytest.raises(TypeError):
        cache.warm([("fine", "ok"), ("triple", "x", "y")])
    assert len(cache) == 0


def test_get_or_put_loads_once_then_serves(cache):
    calls: list[str] = []

    def loader(prompt: str) -> str:
        calls.append(prompt)
        return f"answer to {prompt}"

    assert cache.get_or_put("capital of france", loader) == "answer to capital of france"
    assert cache.get_or_put("capital of france", loader) == "answer to capital of france"
    assert cache.get_or_put("Capital of France?", loader) == "answer to capital of france"
    assert calls == ["capital of france"]
    stats = cache.stats()
    assert (stats.misses, stats.exact_hits, stats.semantic_hits, stats.loads) == (1, 1, 1, 1)


def test_get_or_put_stores_without_embedding_twice(cache, fake_embedder):
    cache.get_or_put("some new prompt", lambda p: "x")
    assert fake_embedder.calls == 1


def test_a_loader_that_raises_stores_nothing_and_its_error_reaches_the_caller(cache):
    class Boom(Exception):
        pass

    def loader(prompt: str) -> str:
        raise Boom("model down")

    with pytest.raises(Boom, match="model down"):
        cache.get_or_put("q", loader)
    assert len(cache) == 0
    assert cache.get_or_put("q", lambda p: "ok") == "ok"


def test_a_loader_returning_a_non_str_is_a_type_error_and_stores_nothing(cache):
    with pytest.raises(TypeError, match="loader"):
        cache.get_or_put("q", lambda p: 42)
    assert len(cache) == 0


def test_get_or_put_all_calls_the_loader_once_with_distinct_misses_in_first_seen_order(cache):
    cache.put("known one", "K")
    batches: list[list[str]] = []

    def loader(missed: list[str]) -> list[str]:
        batches.append(list(missed))
        return [m.upper() for m in missed]

    prompts = ["zeta", "known one", "alpha", "zeta", "Known One!", "beta", "alpha"]
    out = cache.get_or_put_all(prompts, loader)
    assert batches == [["zeta", "alpha", "beta"]]
    assert out == ["ZETA", "K", "ALPHA", "ZETA", "K", "BETA", "ALPHA"]
    assert cache.get_or_put_all(prompts, loader) == out
    assert len(batches) == 1  # the second pass was all hits: no loader call at all


@pytest.mark.parametrize("returned", [["only one"], ["a", "b", "c"], []])
def test_get_or_put_all_wrong_count_is_a_value_error_and_stores_nothing(cache, returned):
    with pytest.raises(ValueError, match="responses for 2 prompts"):
        cache.get_or_put_all(["p one", "p two"], lambda missed: returned)
    assert len(cache) == 0


@pytest.mark.parametrize("returned", ["a string", None, ["ok", 3]])
def test_get_or_put_all_wrong_types_are_a_type_error_and_store_nothing(cache, returned):
    with pytest.raises(TypeError):
        cache.get_or_put_all(["p one", "p two"], lambda missed: returned)
    assert len(cache) == 0


# --------------------------------------------------------------------- expiry and eviction


def test_entries_expire_after_ttl(fake_embedder, clock):
    cache = SemanticCache(fake_embedder, ttl=10, device="cpu", timer=clock, threshold=0.8)
    cache.put("q", "a")
    cache.put("long lived", "b", ttl=100)
    clock.now += 9.9
    assert cache.get("q") is not None
    clock.now += 0.2
    assert cache.get("q") is None  # exact tier
    assert cache.get("q?") is None  # semantic tier: masked in the scan
    assert cache.get("long lived").response == "b"
    assert cache.stats().expirations == 1 and len(cache) == 1


def test_a_hit_says_how_old_its_answer_is_and_an_unknown_age_is_infinite(fake_embedder, clock, tmp_path):
    """Callers that accept nothing older than N seconds (HTTP max-age) read ``Hit.age``: the
    seconds since the response was stored (a new response restarts it); an entry whose store
    time is unknown (restored from a snapshot) is infinitely old, never fresh by accident."""
    cache = SemanticCache(fake_embedder, device="cpu", timer=clock, threshold=0.8)
    cache.put("q", "a")
    clock.now += 5
    assert cache.get("q").age == 5 and cache.get("q?").age == 5  # exact and semantic tiers
    cache.put("q", "a newer answer")
    clock.now += 1
    assert cache.get("q").age == 1
    cache.save(tmp_path / "c.gpucache")
    restored = SemanticCache.load(tmp_path / "c.gpucache", embedder=fake_embedder, device="cpu", timer=clock)
    assert restored.get("q").age == math.inf


def test_expired_entries_are_not_served_semantically(fake_embedder, clock):
    cache = SemanticCache(fake_embedder, ttl=5, device="cpu", timer=clock, threshold=0.8)
    cache.put("the quick brown fox", "a")
    clock.now += 6
    assert cache.get("The quick brown fox!") is None
    assert len(cache) == 0


def test_full_cache_evicts_the_least_recently_used(fake_embedder, clock):
    cache = SemanticCache(fake_embedder, capacity=3, device="cpu", timer=clock, threshold=0.8)
    cache.warm([("one", "1"), ("two", "2"), ("three", "3")])
    cache.get("one")  # now "two" is the least recently used
    cache.put("four", "4")
    assert len(cache) == 3
    assert cache.get("two") is None
    assert [cache.get(p).response for p in ("one", "three", "four")] == ["1", "3", "4"]
    assert cache.stats().evictions == 1


def test_a_semantic_hit_makes_its_entry_the_most_recently_used(fake_embedder, clock):
    cache = SemanticCache(
        fake_embedder, capacity=3, device="cpu", timer=clock, threshold=0.8, verifier=ThresholdOnly()
    )
    cache.warm([("alpha beta gamma delta", "1"), ("two", "2"), ("three", "3")])
    hit = cache.get("alpha beta gamma delta epsilon")  # the same words and one more
    assert hit is not None and not hit.exact and hit.response == "1"
    cache.put("four", "4")  # "two" is now the least recently used, not the entry just served
    assert cache.get("two") is None
    assert [cache.get(p).response for p in ("alpha beta gamma delta", "three", "four")] == ["1", "3", "4"]


def test_expired_entries_go_before_live_ones_are_evicted(fake_embedder, clock):
    cache = SemanticCache(fake_embedder, capacity=2, device="cpu", timer=clock, threshold=0.8)
    cache.put("short", "s", ttl=1)
    cache.put("keep", "k")
    clock.now += 2
    cache.put("new", "n")
    assert cache.get("keep").response == "k"
    stats = cache.stats()
    assert stats.evictions == 0 and stats.expirations == 1


def test_a_batch_larger_than_capacity_keeps_the_last_entries(fake_embedder):
    cache = SemanticCache(fake_embedder, capacity=2, device="cpu", threshold=0.8)
    assert cache.warm([("p1", "1"), ("p2", "2"), ("p3", "3")]) == 2
    assert len(cache) == 2 and cache.get("p3").response == "3"


def test_capacity_also_bounds_the_memory_the_texts_hold(fake_embedder, clock):
    """Four entries of about 4 KB each under a 10 KB text budget: the least recently used go,
    however few entries there are, and one larger than the whole budget is never stored."""
    cache = SemanticCache(fake_embedder, max_text_bytes=10_000, device="cpu", timer=clock, threshold=0.8)
    for n in range(4):
        cache.put(f"prompt {n} " + "x" * 4_000, f"answer {n}")
    kept = [n for n in range(4) if cache.get(f"prompt {n} " + "x" * 4_000) is not None]
    assert kept == [2, 3] and cache.stats().evictions == 2
    assert cache.put("a huge prompt " + "y" * 20_000, "a short answer") is False
    assert cache.stats().refusals["too-large"] == 1 and len(cache) == 2
    cache.put("prompt 3 " + "x" * 4_000, "a new answer " + "z" * 3_000)  # a bigger update evicts too
    assert cache.get("prompt 2 " + "x" * 4_000) is None and len(cache) == 1
    cache.put("prompt 3 " + "x" * 4_000, "z" * 9_000)  # an update past the budget: the entry goes
    assert len(cache) == 0 and cache.stats().refusals["too-large"] == 2


def test_one_tenants_junk_evicts_its_own_entries_and_no_one_elses(fake_embedder, clock):
    cache = SemanticCache(
        fake_embedder, capacity=100, tenant_capacity=5, device="cpu", timer=clock, threshold=0.8
    )
    cache.warm([(f"team question {n}", "a") for n in range(5)], scope="key:team/ns:x")
    for n in range(50):
        cache.put(f"junk {n}", "j", scope=f"key:mallory/q:{n % 7}")  # across many of its scopes
    assert all(cache.get(f"team question {n}", scope="key:team/ns:x") for n in range(5))
    mallory = [n for n in range(50) if cache.get(f"junk {n}", scope=f"key:mallory/q:{n % 7}")]
    assert mallory == list(range(45, 50)) and len(cache) == 10
    # without a tenant capacity, one LRU for all: the same junk pushes the team out
    shared = SemanticCache(fake_embedder, capacity=10, device="cpu", timer=clock, threshold=0.8)
    shared.warm([(f"team question {n}", "a") for n in range(5)], scope="key:team/ns:x")
    for n in range(50):
        shared.put(f"junk {n}", "j", scope=f"key:mallory/q:{n % 7}")
    assert not any(shared.get(f"team question {n}", scope="key:team/ns:x") for n in range(5))


def test_a_scope_is_forgotten_with_its_last_entry(fake_embedder, clock):
    cache = SemanticCache(fake_embedder, device="cpu", timer=clock, threshold=0.8)
    for n in range(20):
        cache.put("a question", "a", scope=f"key:k/q:{n}")
    assert cache._core.table.scopes == 20
    for n in range(20):
        cache.invalidate("a question", scope=f"key:k/q:{n}")
    assert cache._core.table.scopes == 0
    cache.put("a question", "again", scope="key:k/q:3")  # a scope used again works as new
    assert cache.get("a question", scope="key:k/q:3").response == "again"
    assert cache.get("a question", scope="key:k/q:4") is None


def test_a_snapshot_restored_under_a_smaller_text_budget_keeps_the_most_recent(fake_embedder, tmp_path):
    big = SemanticCache(fake_embedder, device="cpu", threshold=0.8)
    for n in range(4):
        big.put(f"prompt {n} " + "x" * 4_000, f"answer {n}")
    big.save(tmp_path / "c.gpucache")
    small = SemanticCache.load(
        tmp_path / "c.gpucache", embedder=fake_embedder, device="cpu", max_text_bytes=10_000
    )
    assert [n for n in range(4) if small.get(f"prompt {n} " + "x" * 4_000) is not None] == [2, 3]


# --------------------------------------------------------------------- upkeep


def test_invalidate_removes_only_that_prompt_in_that_scope(cache):
    cache.put("q", "a")
    cache.put("q", "b", scope="other")
    assert cache.invalidate("q") is True
    assert cache.invalidate("q") is False
    assert cache.get("q") is None
    assert cache.get("q", scope="other").response == "b"


def test_clear_one_scope_or_all(cache):
    cache.warm([("a1", "x"), ("a2", "y")], scope="a")
    cache.put("b1", "z", scope="b")
    cache.clear("a")
    assert len(cache) == 1 and cache.get("b1", scope="b") is not None
    cache.clear()
    assert len(cache) == 0 and cache.get("b1", scope="b") is None
    cache.put("fresh", "f")
    assert cache.get("fresh").response == "f"


def test_clear_under_removes_a_scope_and_every_scope_below_it_and_nothing_else(cache):
    for scope in ("key:ab", "key:ab/ns:team", "key:ab/q:1", "key:abc", "key:a", "other/key:ab"):
        cache.put(f"note of {scope}", "n", scope=scope)
    assert cache.clear_under("key:ab") == 3
    assert [
        s
        for s in ("key:ab", "key:ab/ns:team", "key:ab/q:1", "key:abc", "key:a", "other/key:ab")
        if cache.get(f"note of {s}", scope=s) is not None
    ] == ["key:abc", "key:a", "other/key:ab"]
    assert cache.clear_under("key:ab") == 0


def test_stats_add_up(cache):
    cache.get_or_put_all(["a", "b", "a"], lambda ms: ms)
    cache.get_all(["a", "A!", "zzz"])
    stats = cache.stats()
    assert isinstance(stats, CacheStats)
    assert stats.hits == stats.exact_hits + stats.semantic_hits
    assert stats.lookups == 6 and stats.misses == 4 and stats.entries == 2
    assert stats.hit_rate == pytest.approx(2 / 6)


def test_stats_say_where_lookup_time_goes(cache, fake_embedder):
    cache.put("stored", "s")  # one prompt embedded to store it
    cache.get_all(["stored", "new one", "another"])  # one exact hit; two embedded, one scan
    cache.get("stored")  # the exact tier: nothing embedded, no scan
    stats = cache.stats()
    assert stats.embedded == 3 and stats.scans == 1
    assert stats.embed_seconds > 0 and stats.scan_seconds > 0


# --------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "bad, error",
    [
        (None, TypeError),
        (b"bytes", TypeError),
        (42, TypeError),
        (["list"], TypeError),
        ("", ValueError),
        ("  \n\t", ValueError),
    ],
)
def test_bad_prompts_raise_and_change_nothing(cache, fake_embedder, bad, error):
    cache.put("kept", "k")
    before = (len(cache), cache.stats(), fake_embedder.calls)
    with pytest.raises(error):
        cache.get(bad)
    with pytest.raises(error):
        cache.put(bad, "r")
    with pytest.raises(error):
        cache.get_or_put(bad, lambda p: "r")
    with pytest.raises(error):
        cache.get_all(["fine", bad])
    with pytest.raises(error):
        cache.get_or_put_all(["fine", bad], lambda ms: ms)
    with pytest.raises(error):
        cache.warm([("fine", "ok"), (bad, "r")])
    with pytest.raises(error):
        cache.invalidate(bad)
    assert (len(cache), cache.stats(), fake_embedder.calls) == before


@pytest.mark.parametrize("bad", [None, b"bytes", 42, ["x"]])
def test_bad_responses_raise_type_error(cache, bad):
    with pytest.raises(TypeError):
        cache.put("q", bad)
    assert len(cache) == 0


@pytest.mark.parametrize("bad", [1, b"scope", ["a"]])
def test_bad_scopes_raise_type_error(cache, bad):
    with pytest.raises(TypeError, match="scope"):
        cache.get("q", scope=bad)
    with pytest.raises(TypeError, match="scope"):
        cache.put("q", "a", scope=bad)
    assert len(cache) == 0


def test_a_bare_string_is_not_a_list_of_prompts(cache):
    with pytest.raises(TypeError, match="list of str"):
        cache.get_all("not a list")
    with pytest.raises(TypeError, match="callable"):
        cache.get_or_put_all(["a"], "not callable")


def test_an_embedder_failure_changes_nothing(cache, fake_embedder):
    cache.put("kept", "k")
    fake_embedder.fail_with = RuntimeError("CUDA error: device-side assert")
    with pytest.raises(RuntimeError, match="device-side"):
        cache.put("new", "n")
    with pytest.raises(RuntimeError, match="device-side"):
        cache.get_or_put("other", lambda p: "x")
    fake_embedder.fail_with = None
    assert len(cache) == 1 and cache.get("kept").response == "k"


# --------------------------------------------------------------------- threads


def test_concurrent_misses_on_one_prompt_call_the_loader_once(fake_embedder):
    cache = SemanticCache(fake_embedder, device="cpu", threshold=0.8)
    calls = []
    gate = threading.Event()

    def slow_loader(prompt: str) -> str:
        calls.append(prompt)
        gate.wait(5)
        return "the answer"

    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_put("hot prompt", slow_loader)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    assert cache._core.flights.wait_for_joins(7, timeout=10)  # one loads, seven wait on it
    gate.set()
    for t in threads:
        t.join(10)
    assert results == ["the answer"] * 8
    assert len(calls) == 1


def test_waiters_receive_the_loaders_error(fake_embedder):
    cache = SemanticCache(fake_embedder, device="cpu", threshold=0.8)
    started = threading.Event()
    gate = threading.Event()

    def failing(prompt: str) -> str:
        started.set()
        gate.wait(5)
        raise ConnectionError("upstream reset")

    errors: list[BaseException] = []

    def call() -> None:
        try:
            cache.get_or_put("hot", failing)
        except ConnectionError as exc:
            errors.append(exc)

    first = threading.Thread(target=call)
    first.start()
    started.wait(5)
    second = threading.Thread(target=call)
    second.start()
    assert cache._core.flights.wait_for_joins(1, timeout=10)  # the second waits on the first's load
    gate.set()
    first.join(10)
    second.join(10)
    assert len(errors) == 2 and errors[0] is errors[1]
    assert len(cache) == 0


# --------------------------------------------------------------------- device budget


def test_a_device_budget_makes_the_cache_evict_instead_of_growing(fake_embedder):
    row = 4 * 64 + 16  # fp32 row of the 64-dim fake embedder
    cache = SemanticCache(
        fake_embedder, device="cpu", max_device_bytes=5 * row, verifier=ThresholdOnly(), threshold=0.8
    )
    cache.warm([(f"prompt {w}", w) for w in "abcde"])
    for w in "fgh":
        cache.put(f"prompt {w}", w)
    assert len(cache) == 5 and cache.store.nbytes <= 5 * row
    assert cache.stats().evictions == 3
    assert cache.get("prompt h").response == "h" and cache.get("prompt a") is None


@pytest.mark.parametrize("mode", ["fp16", "bf16", "int8"])
def test_quantized_caches_serve_the_same_hits(fake_embedder, mode):
    plain = SemanticCache(fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.8)
    quant = SemanticCache(
        fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.8, quantization=mode
    )
    pairs = [(f"topic {i} question about item {i * 7}", str(i)) for i in range(50)]
    for cache in (plain, quant):
        cache.warm(pairs)
    asks = [f"Topic {i} question about item {i * 7}?" for i in range(50)] + ["unrelated words"]
    assert [h and (h.response, round(h.similarity, 5)) for h in quant.get_all(asks)] == [
        h and (h.response, round(h.similarity, 5)) for h in plain.get_all(asks)
    ]


def test_a_miss_stored_while_another_call_was_embedding_is_not_loaded_again():
    """Call B misses the exact tier and is still embedding when call A loads and stores the
    same prompt. B must find A's entry when it claims the load, not become a second loader."""
    import torch

    b_started, a_done = threading.Event(), threading.Event()

    class SlowForB:
        name, dim, device = "slow-for-b", 8, torch.device("cpu")

        def __init__(self) -> None:
            self.calls = 0

        def encode(self, texts):
            self.calls += 1
            if self.calls == 1:  # B's embedding: wait until A has stored the answer
                b_started.set()
                a_done.wait(5)
            # a different random vector each call: B's semantic scan cannot find A's entry
            return torch.nn.functional.normalize(torch.randn(len(texts), 8), dim=1)

    cache = SemanticCache(SlowForB(), device="cpu", threshold=0.999, verifier=ThresholdOnly())
    loads: list[str] = []

    def loader(prompt: str) -> str:
        loads.append(prompt)
        return "answer"

    results: list[str] = []
    b = threading.Thread(target=lambda: results.append(cache.get_or_put("hot", loader)))
    b.start()
    assert b_started.wait(5)
    results.append(cache.get_or_put("hot", loader))  # call A, while B is embedding
    a_done.set()
    b.join(5)
    assert results == ["answer", "answer"] and loads == ["hot"]


def load_across(cache: SemanticCache, prompt: str, removal, answer: str) -> list[str]:
    """``get_or_put(prompt)`` in scope t/a whose loader is held until ``removal(cache)`` has
    returned: what the caller got."""
    started, removed = threading.Event(), threading.Event()

    def slow(p: str) -> str:
        started.set()
        assert removed.wait(10)
        return answer

    got: list[str] = []
    caller = threading.Thread(target=lambda: got.append(cache.get_or_put(prompt, slow, scope="t/a")))
    caller.start()
    assert started.wait(10)
    removal(cache)
    removed.set()
    caller.join(10)
    return got


@pytest.mark.parametrize(
    "removal",
    [
        lambda cache: cache.invalidate("a question in flight", scope="t/a"),
        lambda cache: cache.clear(scope="t/a"),
        lambda cache: cache.clear(),
        lambda cache: cache.clear_under("t"),  # a revoked credential's scopes
    ],
    ids=["invalidate", "clear-scope", "clear-all", "clear-under"],
)
def test_an_answer_loading_across_a_removal_is_handed_over_but_not_stored(fake_embedder, removal):
    """An admin removal that returned is never undone by a load that was in flight when it
    was called: the answer reaches its caller and is not stored. A load claimed after the
    removal stores as ever."""
    cache = SemanticCache(fake_embedder, device="cpu", threshold=0.8)
    got = load_across(cache, "a question in flight", removal, "loaded before the removal returned")
    assert got == ["loaded before the removal returned"]
    assert cache.get("a question in flight", scope="t/a") is None
    assert cache.get_or_put("a question in flight", lambda p: "loaded after", scope="t/a") == "loaded after"
    assert cache.get("a question in flight", scope="t/a").response == "loaded after"


def test_a_removal_elsewhere_does_not_stop_a_load_storing(fake_embedder):
    cache = SemanticCache(fake_embedder, device="cpu", threshold=0.8)

    def elsewhere(c: SemanticCache) -> None:
        c.clear(scope="t/other")
        c.invalidate("another question", scope="t/a")

    assert load_across(cache, "mine", elsewhere, "kept") == ["kept"]
    assert cache.get("mine", scope="t/a").response == "kept"
