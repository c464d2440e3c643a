"""The get-or-load state machine (gpucache/cache/flow.py): the operations it asks for, what it
answers (served.py), and the drivers' handling of waiters that give up (drivers.py)."""

from __future__ import annotations

import asyncio

import pytest

from gpucache import SemanticCache, StoreEverything, ThresholdOnly
from gpucache.cache import drivers, flow
from gpucache.cache.served import Found, Framed, Joined, Keep, Loaded, ServeOnly, Stream
from gpucache.guard.verifier import Verdict


@pytest.fixture
def cache(fake_embedder) -> SemanticCache:
    return SemanticCache(
        fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.9, cache_policy=StoreEverything()
    )


def steps(gen: flow.Flow, core, loader=lambda prompts: [Keep(p.upper()) for p in prompts], opened=None):
    """Drive ``gen`` by hand, recording each operation's kind."""
    kinds, value = [], None
    while True:
        try:
            op = gen.send(value)
        except StopIteration as stop:
            return kinds, stop.value
        kinds.append(type(op).__name__)
        if isinstance(op, flow.Load):
            value = loader(op.prompts)
        elif isinstance(op, flow.Open):
            value = opened
        elif isinstance(op, flow.Relay):
            value = Keep("".join(op.stream.chunks))
        else:
            value = drivers._call(core, op)


def test_a_miss_looks_up_claims_loads_then_stores_and_a_hit_only_looks_up(cache):
    kinds, served = steps(flow.get_or_load(["what is a monad", "what is a monad"], "s", 0.9), cache._core)
    assert kinds == ["Find", "ClaimShared", "Load", "Finish"]
    assert served == [Loaded("WHAT IS A MONAD")] * 2
    kinds, served = steps(flow.get_or_load(["what is a monad"], "s", 0.9), cache._core)
    assert kinds == ["Find"] and [type(s) for s in served] == [Found]
    assert served[0].hit.response == "WHAT IS A MONAD" and served[0].hit.exact


def test_a_stream_opens_relays_then_stores_and_a_repeat_is_found(cache):
    opened = Stream("the headers", ["why did ", "the chicken"])
    kinds, served = steps(flow.stream("tell me a joke", "s", 0.9), cache._core, opened=opened)
    assert kinds == ["Find", "ClaimShared", "Open", "Relay", "Finish"] and served == Loaded("the headers")
    kinds, served = steps(flow.stream("tell me a joke", "s", 0.9), cache._core)
    assert kinds == ["Find"] and served.hit.response == "why did the chicken"


def test_a_source_that_refuses_on_opening_is_served_and_nothing_is_kept(cache):
    kinds, served = steps(flow.stream("is the model up", "s", 0.9), cache._core, opened=ServeOnly(503))
    assert kinds == ["Find", "ClaimShared", "Open", "Finish"] and served == Loaded(503)
    assert cache.get("is the model up", scope="s") is None and len(cache._core.flights) == 0


def test_a_loader_error_thrown_into_the_flow_releases_the_claim(cache):
    gen = flow.get_or_load(["p"], "s", 0.9)
    find = gen.send(None)
    assert isinstance(find, flow.Find)
    claim = gen.send(drivers._call(cache._core, find))
    load = gen.send(drivers._call(cache._core, claim))
    assert isinstance(load, flow.Load) and len(cache._core.flights) == 1
    abort = gen.throw(KeyError("the model is down"))
    assert isinstance(abort, flow.Abort) and isinstance(abort.error, KeyError)
    with pytest.raises(KeyError):
        gen.send(drivers._call(cache._core, abort))
    assert len(cache._core.flights) == 0


def test_a_cancelled_waiter_leaves_the_load_and_the_other_waiters_alone(cache, monkeypatch):
    """Cancelling a task that waits on another call's load must not cancel the shared future:
    the loader finishes, the other waiters get its answer, and it is stored."""

    async def main() -> None:
        started, release, both_waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
        calls, waiting = [], []
        real_wait = drivers.wait

        async def observed_wait(future):
            waiting.append(future)
            if len(waiting) == 2:
                both_waiting.set()
            return await real_wait(future)

        monkeypatch.setattr(drivers, "wait", observed_wait)

        async def loader(prompt: str) -> str:
            calls.append(prompt)
            started.set()
            await release.wait()
            return "the answer"

        leader = asyncio.create_task(cache.aget_or_put("a slow question", loader))
        await started.wait()
        quitter = asyncio.create_task(cache.aget_or_put("a slow question", loader))
        stayer = asyncio.create_task(cache.aget_or_put("a slow question", loader))
        await both_waiting.wait()
        quitter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await quitter
        release.set()
        assert await leader == await stayer == "the answer"
        assert calls == ["a slow question"]
        assert cache.get("a slow question").response == "the answer"

    asyncio.run(main())


def test_the_typed_call_says_whether_it_was_found_loaded_or_joined(cache):
    response = {"status": 200, "id": "the upstream's own"}
    served = cache.get_or_load("what is a monad", lambda p: Keep("an answer", response))
    assert served == Loaded(response) and served.value is response  # this call's own value
    served = cache.get_or_load("what is a monad", lambda p: pytest.fail("a hit loads nothing"))
    assert isinstance(served, Found) and served.hit.exact and served.hit.response == "an answer"
    served = cache.get_or_load("What is a monad?", lambda p: pytest.fail("a hit loads nothing"))
    assert isinstance(served, Found) and not served.hit.exact
    assert served.hit.cached_prompt == "what is a monad" and served.lookup_seconds > 0

    async def main():
        started, release = asyncio.Event(), asyncio.Event()

        async def slow(prompt):
            started.set()
            await release.wait()
            return Keep("the leader's text", "the leader's value")

        leader = asyncio.create_task(cache.aget_or_load("a new question", slow))
        await started.wait()
        waiter = asyncio.create_task(cache.aget_or_load("a new question", slow))
        assert await asyncio.to_thread(cache._core.flights.wait_for_joins, 1, 30)
        release.set()
        return await leader, await waiter

    leader, waiter = asyncio.run(main())
    assert leader == Loaded("the leader's value") and waiter == Joined("the leader's text")
    with pytest.raises(TypeError, match="Keep"):
        cache.get_or_load("another question", lambda p: "a bare str")
    assert len(cache._core.flights) == 0


def test_a_streamed_typed_call_hands_its_caller_the_pieces_and_stores_them_once_read(cache):
    async def main():
        def opener(prompt):
            return Stream({"x-upstream": "1"}, ["once ", "upon"])

        served = await cache.aget_or_load_streaming("tell me a story", opener)
        assert isinstance(served, Loaded) and served.value == {"x-upstream": "1"}
        assert cache.get("tell me a story") is None  # not yet: the pieces are unread
        pieces = [piece async for piece in served.pieces]
        again = await cache.aget_or_load_streaming("tell me a story", opener)
        return pieces, again

    pieces, again = asyncio.run(main())
    assert pieces == ["once ", "upon"] and isinstance(again, Found) and again.hit.response == "once upon"


def test_framed_chunks_reach_the_caller_whole_and_in_place_and_only_their_text_is_kept(cache):
    """A chunk that carries its frame (the event's bytes the client is sent) passes through the
    cache as it was given, so the caller needs nothing kept in step with the pieces beside it;
    the sync family serves a framed chunk as its text."""
    chunks = [Framed("once ", b"e1"), Framed("", b"keep-alive"), "upon", Framed(" a time", b"e3")]

    async def main():
        served = await cache.aget_or_load_streaming("tell me a story", lambda p: Stream(None, chunks))
        assert isinstance(served, Loaded)
        return [piece async for piece in served.pieces]

    assert asyncio.run(main()) == chunks
    assert cache.get("tell me a story").response == "once upon a time"
    plain = list(cache.get_or_put_streaming("tell me another", lambda p: iter(chunks)))
    assert (
        plain == ["once ", "", "upon", " a time"]
        and cache.get("tell me another").response == "once upon a time"
    )


def test_a_framed_chunk_whose_text_is_not_a_str_is_the_loaders_error(cache):
    def framed_bytes(prompt):
        yield Framed(b"once", b"e1")

    with pytest.raises(TypeError, match="stream chunk's text"):
        list(cache.get_or_put_streaming("tell me a story", framed_bytes))
    assert cache.get("tell me a story") is None and len(cache._core.flights) == 0


def test_pieces_closed_before_any_is_read_release_the_claim_and_close_the_source(cache):
    """A caller that gets ``Loaded(value, pieces)`` and gives up before reading one (its client
    went away) closes the pieces: the claim is released and the source closed, though an
    async generator that never started runs nothing when closed."""

    class Source:
        closed = False

        def __aiter__(self):
            return self

        async def __anext__(self):
            raise AssertionError("never read")

        async def aclose(self):
            Source.closed = True

    async def main():
        served = await cache.aget_or_load_streaming("a question", lambda p: Stream("v", Source()))
        assert isinstance(served, Loaded) and len(cache._core.flights) == 1
        await served.pieces.aclose()
        assert len(cache._core.flights) == 0 and Source.closed
        return await cache.aget_or_put("a question", lambda p: asyncio.sleep(0, "loaded"))

    assert asyncio.run(main()) == "loaded"


def test_a_keep_with_its_own_ttl_lives_that_long(fake_embedder):
    now = [0.0]
    cache = SemanticCache(
        fake_embedder,
        device="cpu",
        verifier=ThresholdOnly(),
        threshold=0.9,
        cache_policy=StoreEverything(),
        ttl=1000.0,
        timer=lambda: now[0],
    )
    cache.get_or_load("short lived", lambda p: Keep("a", ttl=10))
    cache.get_or_load("long lived", lambda p: Keep("b"))

    async def stream():
        async def chunks():
            yield "c"
            yield Keep(ttl=20)

        served = await cache.aget_or_load_streaming("streamed", lambda p: Stream(None, chunks()))
        return [piece async for piece in served.pieces]

    assert asyncio.run(stream()) == ["c"]
    now[0] = 15.0
    assert cache.get("short lived") is None and cache.get("long lived").response == "b"
    assert cache.get("streamed").response == "c"
    now[0] = 25.0
    assert cache.get("streamed") is None


def test_a_store_that_fails_after_the_load_serves_the_answer_and_releases_the_claim(cache):
    def broken(prompt, response, scope):
        raise RuntimeError("the policy broke")

    cache._core.cache_policy.decide = broken
    served = cache.get_or_load("a question", lambda p: Keep("an answer", "the value"))
    assert served == Loaded("the value") and isinstance(served.failed, RuntimeError)
    assert len(cache._core.flights) == 0
    with pytest.raises(RuntimeError, match="the policy broke"):  # the text call raises it
        cache.get_or_put("another question", lambda p: "an answer")
    assert len(cache._core.flights) == 0


def test_a_loaded_answer_lives_the_ttl_its_call_gave(fake_embedder):
    now = [0.0]
    cache = SemanticCache(
        fake_embedder,
        device="cpu",
        verifier=ThresholdOnly(),
        threshold=0.9,
        cache_policy=StoreEverything(),
        ttl=1000.0,
        timer=lambda: now[0],
    )
    cache.get_or_put("short lived", lambda p: "a", ttl=10)
    cache.get_or_put("long lived", lambda p: "b")
    now[0] = 11.0
    assert cache.get("short lived") is None and cache.get("long lived").response == "b"
    with pytest.raises(ValueError, match="ttl"):
        cache.get_or_put("q", lambda p: "x", ttl=-1)


# --------------------------------------------------------------------- serve, do not keep


def test_a_serve_only_answer_reaches_its_caller_and_nothing_is_kept(cache):
    refused = {"status": 500}
    served = cache.get_or_load("is the model up", lambda p: ServeOnly(refused))
    assert served == Loaded(refused) and served.value is refused
    assert cache.get("is the model up") is None
    assert len(cache._core.flights) == 0  # every claim released


def test_a_stream_that_ends_serve_only_is_served_whole_and_kept_from_everyone(cache):
    def truncated(prompt):
        yield "once upon "
        yield "a time"
        yield ServeOnly()  # the loader's last item: not passed on

    assert list(cache.get_or_put_streaming("tell me a story", truncated)) == ["once upon ", "a time"]
    assert cache.get("tell me a story") is None and len(cache._core.flights) == 0

    async def consume():
        async def agen(prompt):
            yield "half a"
            yield ServeOnly("finish_reason length")

        return [piece async for piece in cache.aget_or_put_streaming("tell me another", agen)]

    assert asyncio.run(consume()) == ["half a"] and cache.get("tell me another") is None


def test_waiters_on_a_serve_only_load_load_their_own_and_never_see_it(cache):
    """An answer that is not kept is never handed to another caller: the waiters run their
    own load, as after a load that was abandoned."""

    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()
        calls: list[str] = []

        async def loader(prompt: str):
            calls.append(prompt)
            if len(calls) == 1:
                started.set()
                await release.wait()
                return ServeOnly("the leader's private error")
            return Keep("the waiter's own answer")

        leader = asyncio.create_task(cache.aget_or_load("a flaky question", loader))
        await started.wait()
        waiter = asyncio.create_task(cache.aget_or_load("a flaky question", loader))
        assert await asyncio.to_thread(cache._core.flights.wait_for_joins, 1, 30)  # the waiter joined
        release.set()
        assert await leader == Loaded("the leader's private error")
        assert await waiter == Loaded("the waiter's own answer") and len(calls) == 2
        assert cache.get("a flaky question").response == "the waiter's own answer"

    asyncio.run(main())


def test_a_stream_closed_inside_a_cancelled_task_releases_its_claim_at_once(cache):
    """A client that goes away mid-stream is cancelled inside the server's task group (anyio),
    where every await of the clean-up may be cancelled again: the claim is released before
    any of them, so the next caller of the prompt loads instead of waiting forever."""
    anyio = pytest.importorskip("anyio")

    async def main() -> None:
        started = asyncio.Event()

        async def endless(prompt: str):
            yield "the first words"
            await asyncio.Event().wait()  # a generation that never ends by itself
            yield "never"

        async def consume() -> None:
            pieces = cache.aget_or_put_streaming("an endless question", endless)
            try:
                async for _ in pieces:
                    started.set()
            finally:
                await pieces.aclose()

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            await started.wait()
            group.cancel_scope.cancel()
        assert len(cache._core.flights) == 0
        assert (
            await cache.aget_or_put("an endless question", lambda p: asyncio.sleep(0, "loaded")) == "loaded"
        )

    asyncio.run(main())


def test_a_stream_cancelled_while_its_answer_is_handed_on_still_releases_its_claim(cache):
    """A client that goes away just as its streamed load ends: the bookkeeping that stores the
    answer and hands it to waiters is queued for a worker thread when the task is cancelled.
    It still runs, so the claim is released and the next caller of the prompt is not left
    waiting on it for good (a proxy once hung on exactly this)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    finished = threading.Event()
    real_finish = cache._core.finish

    def finish(*args, **kwargs):
        real_finish(*args, **kwargs)
        finished.set()

    cache._core.finish = finish
    gate = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        loader_done = asyncio.Event()
        blocker = None

        async def chunks(prompt):
            nonlocal blocker
            try:
                yield "the only part"
                blocker = loop.run_in_executor(None, gate.wait, 30)  # the one worker is busy
            finally:
                loader_done.set()

        async def consume():
            return [piece async for piece in cache.aget_or_put_streaming("a question", chunks)]

        task = asyncio.create_task(consume())
        await loader_done.wait()  # the load ended; its bookkeeping waits for the busy worker
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gate.set()
        await blocker
        handed_on = await asyncio.to_thread(finished.wait, 10)
        return handed_on

    assert run_async(main())
    assert len(cache._core.flights) == 0
    assert cache.get("a question").response == "the only part"


def run_async(coro):
    return asyncio.run(coro)


class _WordForWord:
    """Serves a stored prompt only for itself, word for word; names its refusals "reworded"."""

    name = "word-for-word"

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        return cached_prompt == new_prompt

    def explain(self, cached_prompt: str, new_prompt: str) -> Verdict:
        return Verdict(cached_prompt != new_prompt, "reworded")


@pytest.fixture
def strict(fake_embedder) -> SemanticCache:
    # the bag-of-words embedder: the same words in another order are similarity 1.0
    return SemanticCache(
        fake_embedder, device="cpu", verifier=_WordForWord(), threshold=0.9, cache_policy=StoreEverything()
    )


def test_a_load_after_the_verifier_refused_the_best_stored_prompt_names_the_rule(strict):
    strict.put("what is a monad", "stored")
    served = strict.get_or_load("a monad is what", lambda p: Keep("loaded"))
    assert served == Loaded("loaded", refused="reworded")
    unrelated = strict.get_or_load("how tall is everest", lambda p: Keep("loaded"))
    assert unrelated == Loaded("loaded", refused="")  # no stored prompt reached the threshold


def test_a_streamed_load_after_a_refusal_names_the_rule_too(strict):
    strict.put("what is a monad", "stored")

    async def main():
        served = await strict.aget_or_load_streaming(
            "a monad is what", lambda p: _opened(Stream("head", ["a ", "burrito"]))
        )
        chunks = [c async for c in served.pieces]
        return served, chunks

    served, chunks = asyncio.run(main())
    assert served.refused == "reworded" and served.value == "head" and chunks == ["a ", "burrito"]


async def _opened(stream):
    return stream
