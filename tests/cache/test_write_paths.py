"""Which write paths each policy covers, streaming, async, and single-flight.

As the admission seed says: the cache policy covers every write path (put, warm, get_or_put,
get_or_put_all, get_or_put_streaming and the async forms); admission covers only the writes
that follow a miss (the get_or_put family), never put or warm, and never reads.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpucache import AdmissionPolicy, Found, Keep, Loaded, SemanticCache, Stream, ThresholdOnly

SECRET = "Use AKIAIOSFODNN7EXAMPLE as the key"


@pytest.fixture
def make(fake_embedder):
    def make_cache(**kwargs):
        kwargs.setdefault("verifier", ThresholdOnly())
        kwargs.setdefault("threshold", 0.8)
        return SemanticCache(fake_embedder, device="cpu", **kwargs)

    return make_cache


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------- cache policy


def test_policy_covers_put_and_warm(make):
    cache = make()
    assert cache.put("q1", "") is False
    assert cache.put("q2", SECRET) is False
    assert (
        cache.warm(
            [("q3", "fine"), ("q4", "I'm sorry, I can't help with that."), ("mail me at a@b.com", "ok")]
        )
        == 1
    )
    assert len(cache) == 1 and cache.get("q3").response == "fine"
    assert cache.stats().refusals == {
        "empty-response": 1,
        "secret": 1,
        "error-response": 1,
        "personal-data": 1,
    }


def test_policy_covers_every_get_or_put_path_and_still_answers(make):
    cache = make()
    assert cache.get_or_put("q1", lambda p: SECRET) == SECRET  # answered, not stored
    assert cache.get_or_put_all(["q2", "q3"], lambda ms: ["ok", ""]) == ["ok", ""]
    assert "".join(cache.get_or_put_streaming("q4", lambda p: iter(["As an AI, ", "I ..."]))) == (
        "As an AI, I ..."
    )
    assert run(cache.aget_or_put("q5", _async_const(SECRET))) == SECRET
    assert run(cache.aget_or_put_all(["q6"], _async_batch(lambda ms: [""]))) == [""]
    assert run(_collect(cache.aget_or_put_streaming("q7", _async_chunks(["", " "])))) == " "
    assert len(cache) == 1 and cache.get("q2").response == "ok"
    assert sum(cache.stats().refusals.values()) == 6


def test_store_everything_turns_the_policy_off(make):
    from gpucache import StoreEverything

    cache = make(cache_policy=StoreEverything())
    assert cache.put("q", SECRET) is True


def test_a_custom_policy_is_consulted_with_the_scope(make):
    seen = []

    class OnlyScopeA:
        name = "only-a"

        def decide(self, prompt, response, scope):
            from gpucache import PolicyDecision

            seen.append(scope)
            return PolicyDecision(scope == "a", "wrong-scope")

    cache = make(cache_policy=OnlyScopeA())
    assert cache.put("q", "r", scope="a") is True
    assert cache.put("q", "r", scope="b") is False
    assert seen == ["a", "b"] and cache.stats().refusals == {"wrong-scope": 1}


# --------------------------------------------------------------------- admission


def test_admission_stores_on_the_second_sighting(make):
    cache = make(admission=AdmissionPolicy(min_sightings=2))
    calls = []

    def loader(p):
        calls.append(p)
        return f"answer {len(calls)}"

    assert cache.get_or_put("rare question", loader) == "answer 1"
    assert len(cache) == 0 and cache.stats().admissions_deferred == 1
    assert cache.get_or_put("rare question", loader) == "answer 2"  # second sighting: stored
    assert len(cache) == 1
    assert cache.get_or_put("rare question", loader) == "answer 2"  # now a hit
    assert calls == ["rare question", "rare question"]


def test_admission_never_affects_reads(make):
    cache = make(admission=AdmissionPolicy(min_sightings=5))
    cache.put("stored by a caller", "yes")  # put is not traffic: admission does not apply
    assert cache.get_or_put("stored by a caller", lambda p: "no") == "yes"
    assert cache.get_or_put("Stored by a caller!", lambda p: "no") == "yes"  # served semantically


def test_admission_does_not_apply_to_warm(make):
    cache = make(admission=AdmissionPolicy(min_sightings=3))
    assert cache.warm([("a", "1"), ("b", "2")]) == 2


def test_admission_covers_batches_streams_and_async(make):
    cache = make(admission=AdmissionPolicy(min_sightings=2))
    cache.get_or_put_all(["x", "y"], lambda ms: ms)
    "".join(cache.get_or_put_streaming("z", lambda p: iter(["z"])))
    run(cache.aget_or_put("w", _async_const("w")))
    assert len(cache) == 0 and cache.stats().admissions_deferred == 4
    cache.get_or_put_all(["x", "x"], lambda ms: ms)  # x: its second sighting
    assert len(cache) == 1


def test_min_sightings_one_is_no_policy(make):
    cache = make(admission=AdmissionPolicy(min_sightings=1))
    cache.get_or_put("q", lambda p: "a")
    assert len(cache) == 1


def test_admission_is_keyed_on_exact_text_not_similarity(make):
    cache = make(admission=AdmissionPolicy(min_sightings=2))
    cache.get_or_put("reset my password", lambda p: "a")
    cache.get_or_put("Reset my password!", lambda p: "b")  # similar, but another text
    assert len(cache) == 0


# --------------------------------------------------------------------- refresh


def test_a_refresh_is_served_nothing_stored_and_its_answer_replaces_the_entry(make):
    cache = make()
    cache.put("who won the cup", "old")
    served = cache.get_or_load("who won the cup", lambda p: Keep("new", "new"), refresh=True)
    assert isinstance(served, Loaded) and served.value == "new"
    assert cache.get("who won the cup").response == "new" and len(cache) == 1
    assert isinstance(cache.get_or_load("who won the cup", lambda p: Keep("newer", "newer")), Found)


def test_a_refresh_is_admitted_as_a_miss_is(make):
    cache = make(admission=AdmissionPolicy(min_sightings=2))
    cache.get_or_load("rare question", lambda p: Keep("one", "one"), refresh=True)
    assert len(cache) == 0 and cache.stats().admissions_deferred == 1  # seen once: not stored
    cache.get_or_load("rare question", lambda p: Keep("two", "two"), refresh=True)
    assert cache.get("rare question").response == "two"


def test_a_refresh_by_an_async_or_streamed_load_replaces_the_entry(make):
    cache = make()
    cache.put("a", "old a")
    cache.put("b", "old b")

    async def both():
        await cache.aget_or_load("a", _async_const(Keep("new a", "new a")), refresh=True)
        loaded = await cache.aget_or_load_streaming(
            "b", lambda p: Stream("v", _async_chunks(["new ", "b"])(p)), refresh=True
        )
        return "".join([c async for c in loaded.pieces])

    assert run(both()) == "new b"
    assert (cache.get("a").response, cache.get("b").response) == ("new a", "new b")


def test_while_a_refresh_loads_other_callers_are_served_the_stored_answer(make):
    cache = make()
    cache.put("the weather in Oslo", "old")
    inside, release = threading.Event(), threading.Event()

    def slow(prompt):
        inside.set()
        assert release.wait(10)
        return Keep("new", "new")

    refreshing = threading.Thread(
        target=cache.get_or_load, args=("the weather in Oslo", slow), kwargs={"refresh": True}
    )
    refreshing.start()
    assert inside.wait(10)
    assert cache.get("the weather in Oslo").response == "old"
    release.set()
    refreshing.join(10)
    assert cache.get("the weather in Oslo").response == "new"


def test_in_one_batch_a_refresh_misses_what_a_plain_lookup_of_the_same_prompt_finds(make):
    from gpucache.cache.lookup import LookupRequest

    cache = make()
    cache.put("the capital of Peru", "Lima")
    plain = LookupRequest(("the capital of Peru", "The capital of Peru?"), "default", 0.8, claim=False)
    refresh = LookupRequest(
        ("the capital of Peru", "The capital of Peru?"), "default", 0.8, claim=False, refresh=True
    )
    found_plain, found_refresh = cache._core.lookup.find([plain, refresh])
    assert found_plain.hits["the capital of Peru"].response == "Lima"
    assert found_refresh.hits == {"the capital of Peru": None, "The capital of Peru?": None}
    assert found_refresh.vectors.shape[0] == 2 and bool(
        found_refresh.vectors.abs().sum(1).all()
    )  # for the store


def test_refresh_must_be_a_bool(make):
    with pytest.raises(TypeError, match="refresh must be a bool"):
        make().get_or_load("q", lambda p: Keep("a", "a"), refresh="yes")


# --------------------------------------------------------------------- streaming


def test_a_miss_streams_through_and_is_stored_after_completion(make):
    cache = make(replay_chunk_chars=4)
    stream = cache.get_or_put_streaming("q", lambda p: iter(["hel", "lo ", "world"]))
    assert list(stream) == ["hel", "lo ", "world"]
    assert cache.get("q").response == "hello world"
    assert list(cache.get_or_put_streaming("q", lambda p: iter(["never"]))) == ["hell", "o wo", "rld"]


def test_the_first_chunk_arrives_before_the_loader_finishes(make):
    cache = make()
    release = threading.Event()
    finished = threading.Event()

    def loader(prompt):
        yield "first"
        release.wait(5)
        yield " second"
        finished.set()

    stream = cache.get_or_put_streaming("q", loader)
    assert next(stream) == "first"
    assert not finished.is_set() and len(cache) == 0
    release.set()
    assert list(stream) == [" second"]
    assert finished.is_set() and cache.get("q").response == "first second"


def test_a_consumer_that_stops_reading_stores_nothing_and_closes_the_loader(make):
    cache = make()
    closed = []

    def loader(prompt):
        try:
            yield "a"
            yield "b"
        finally:
            closed.append(True)

    stream = cache.get_or_put_streaming("q", loader)
    assert next(stream) == "a"
    stream.close()
    assert closed == [True] and len(cache) == 0
    assert list(cache.get_or_put_streaming("q", lambda p: iter(["again"]))) == ["again"]
    assert cache.get("q").response == "again"


def test_a_stream_that_fails_stores_nothing_and_raises_unchanged(make):
    cache = make()

    class Upstream(Exception):
        pass

    def loader(prompt):
        yield "partial"
        raise Upstream("connection reset")

    stream = cache.get_or_put_streaming("q", loader)
    assert next(stream) == "partial"
    with pytest.raises(Upstream, match="connection reset"):
        next(stream)
    assert len(cache) == 0


@pytest.mark.parametrize("bad", [None, 42, "a string, not chunks"])
def test_a_streaming_loader_must_return_chunks(make, bad):
    cache = make()
    with pytest.raises(TypeError, match="iterable of str chunks"):
        list(cache.get_or_put_streaming("q", lambda p: bad))
    with pytest.raises(TypeError, match="stream chunk"):
        list(cache.get_or_put_streaming("q", lambda p: iter(["ok", 3])))
    assert len(cache) == 0


def test_a_second_streamer_replays_the_first_stream_once_it_completes(make):
    cache = make()
    release = threading.Event()
    loads = []

    def loader(prompt):
        loads.append(prompt)
        yield "one "
        release.wait(5)
        yield "two"

    first = cache.get_or_put_streaming("q", loader)
    assert next(first) == "one "
    result = []
    second = threading.Thread(target=lambda: result.append("".join(cache.get_or_put_streaming("q", loader))))
    second.start()
    assert cache._core.flights.wait_for_joins(1, timeout=10)  # the second stream waits on the first
    release.set()
    assert list(first) == ["two"]
    second.join(5)
    assert result == ["one two"] and loads == ["q"]


def test_a_waiter_loads_itself_when_the_first_consumer_abandons(make):
    cache = make()
    release = threading.Event()

    def slow(prompt):
        yield "x"
        release.wait(5)
        yield "y"

    first = cache.get_or_put_streaming("q", slow)
    next(first)
    result = []
    waiter = threading.Thread(target=lambda: result.append(cache.get_or_put("q", lambda p: "own load")))
    waiter.start()
    assert cache._core.flights.wait_for_joins(1, timeout=10)
    first.close()  # the leader gives up: the waiter must not fail, it loads itself
    waiter.join(5)
    assert result == ["own load"]


# --------------------------------------------------------------------- async


def _async_const(value):
    async def loader(prompt):
        await asyncio.sleep(0)
        return value

    return loader


def _async_batch(fn):
    async def loader(prompts):
        await asyncio.sleep(0)
        return fn(prompts)

    return loader


def _async_chunks(chunks):
    async def gen():
        for c in chunks:
            await asyncio.sleep(0)
            yield c

    return lambda prompt: gen()


async def _collect(agen):
    return "".join([c async for c in agen])


def test_async_get_and_get_or_put(make):
    cache = make()

    async def main():
        assert await cache.aget("q") is None
        assert await cache.aget_or_put("q", _async_const("a")) == "a"
        hit = await cache.aget("Q?")
        assert hit is not None and hit.response == "a"
        assert await cache.aget_all(["q", "zzz"]) == [cache.get("q"), None]
        out = await cache.aget_or_put_all(["q", "new", "new"], _async_batch(lambda ms: ["N"]))
        assert out == ["a", "N", "N"]
        assert await _collect(cache.aget_or_put_streaming("s", _async_chunks(["1", "2"]))) == "12"
        assert await _collect(cache.aget_or_put_streaming("s", _async_chunks(["x"]))) == "12"

    run(main())


def test_async_loader_errors_reach_the_caller_and_store_nothing(make):
    cache = make()

    async def failing(prompt):
        raise LookupError("model gone")

    with pytest.raises(LookupError, match="model gone"):
        run(cache.aget_or_put("q", failing))
    with pytest.raises(ValueError, match="responses for 2 prompts"):
        run(cache.aget_or_put_all(["a", "b"], _async_batch(lambda ms: ["only one"])))
    assert len(cache) == 0


def test_concurrent_tasks_load_once(make):
    cache = make()
    calls = []

    async def slow(prompt):
        calls.append(prompt)
        # the other nine calls wait on this load before it returns
        assert await asyncio.to_thread(cache._core.flights.wait_for_joins, 9, 10)
        return "answer"

    async def main():
        return await asyncio.gather(*(cache.aget_or_put("hot", slow) for _ in range(10)))

    assert run(main()) == ["answer"] * 10
    assert calls == ["hot"]


def test_threads_and_tasks_share_one_load(make):
    cache = make()
    calls = []
    gate = threading.Event()

    loading = threading.Event()

    def blocking(prompt):
        calls.append(prompt)
        loading.set()
        gate.wait(5)
        return "from thread"

    thread_result = []
    t = threading.Thread(target=lambda: thread_result.append(cache.get_or_put("hot", blocking)))
    t.start()
    assert loading.wait(10)  # the thread leads the load

    async def main():
        task = asyncio.ensure_future(cache.aget_or_put("hot", _async_const("from task")))
        assert await asyncio.to_thread(cache._core.flights.wait_for_joins, 1, 10)  # the task waits on it
        gate.set()
        return await task

    assert run(main()) == "from thread"
    t.join(5)
    assert thread_result == ["from thread"] and calls == ["hot"]


def test_a_cancelled_leader_lets_waiters_load(make):
    cache = make()

    async def main():
        loading, never = asyncio.Event(), asyncio.Event()

        async def stuck(prompt):
            loading.set()
            await never.wait()  # never set: only the cancellation ends this load
            return "never"

        leader = asyncio.ensure_future(cache.aget_or_put("q", stuck))
        await loading.wait()
        follower = asyncio.ensure_future(cache.aget_or_put("q", _async_const("mine")))
        assert await asyncio.to_thread(cache._core.flights.wait_for_joins, 1, 10)
        leader.cancel()
        return await follower

    assert run(main()) == "mine"


def test_the_event_loop_keeps_serving_while_a_large_batch_is_embedded(real_embedder):
    """The real embedder, held inside its batch until the loop has ticked five times: were the
    batch embedded on the loop's thread, the loop could not tick and the wait would time out."""
    ticked = threading.Event()

    class HeldEmbedder:
        name, dim, device = real_embedder.name, real_embedder.dim, real_embedder.device

        def encode(self, texts):
            vectors = real_embedder.encode(texts)
            if not ticked.wait(10):
                raise TimeoutError("the event loop did not tick while the batch was embedded")
            return vectors

    cache = SemanticCache(HeldEmbedder(), device="cpu")
    prompts = [f"Question number {i}: how do I configure feature {i} of product {i % 7}?" for i in range(200)]

    async def main():
        stop, ticks = asyncio.Event(), []

        async def ticker():
            while not stop.is_set():
                ticks.append(1)
                if len(ticks) == 5:
                    ticked.set()
                await asyncio.sleep(0)  # a turn of the loop

        tick = asyncio.ensure_future(ticker())
        hits = await cache.aget_all(prompts)
        stop.set()
        await tick
        return hits

    assert run(main()) == [None] * len(prompts)


def test_a_stream_that_is_never_started_holds_nothing(make):
    cache = make()
    abandoned = cache.get_or_put_streaming("q", lambda p: iter(["never read"]))
    result = []
    t = threading.Thread(target=lambda: result.append(cache.get_or_put("q", lambda p: "other")))
    t.start()
    t.join(5)
    assert result == ["other"]  # not blocked behind the unstarted stream
    del abandoned
