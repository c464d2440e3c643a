"""The get-or-load state machine (gpucache/cache/flow.py): the operations it asks for, and the
async driver's handling of waiters that give up."""

from __future__ import annotations

import asyncio

import pytest

from gpucache import SemanticCache, StoreEverything, ThresholdOnly
from gpucache.cache import flow
from gpucache.cache.lookup import LookupRequest


@pytest.fixture
def cache(fake_embedder) -> SemanticCache:
    return SemanticCache(fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.9,
                         cache_policy=StoreEverything())


def steps(gen: flow.Flow, loader=lambda prompts: [p.upper() for p in prompts]):
    """Drive ``gen`` by hand, recording each operation's kind."""
    kinds, value = [], None
    while True:
        try:
            op = gen.send(value)
        except StopIteration as stop:
            return kinds, stop.value
        kinds.append(type(op).__name__)
        value = loader(op.prompts) if isinstance(op, flow.Load) else flow._call(op)


def test_a_miss_looks_up_loads_then_stores_and_a_hit_only_looks_up(cache):
    kinds, answers = steps(flow.get_or_load(cache.core, ["what is a monad", "what is a monad"], "s"))
    assert (kinds, answers) == (["Find", "Load", "Work"], ["WHAT IS A MONAD"] * 2)
    kinds, answers = steps(flow.get_or_load(cache.core, ["what is a monad"], "s"))
    assert (kinds, answers) == (["Find"], ["WHAT IS A MONAD"])


def test_a_stream_loads_a_miss_then_replays_it_as_a_hit(cache):
    gen = flow.stream(cache.core, "tell me a joke", "s")
    op = gen.send(None)
    assert isinstance(op, flow.Find)
    op = gen.send(flow._call(op))
    assert isinstance(op, flow.LoadStream)  # the driver passes the chunks through
    op = gen.send("why did the chicken")  # ... and answers with the whole text
    assert isinstance(op, flow.Work)  # store it
    with pytest.raises(StopIteration) as done:
        gen.send(flow._call(op))
    assert done.value.value is None
    gen = flow.stream(cache.core, "tell me a joke", "s")
    op = gen.send(None)
    with pytest.raises(StopIteration) as done:
        gen.send(flow._call(op))
    assert done.value.value == flow.Replay("why did the chicken")


def test_a_loader_error_thrown_into_the_flow_releases_the_claim(cache):
    gen = flow.get_or_load(cache.core, ["p"], "s")
    assert isinstance(gen.send(None), flow.Find)
    load = gen.send(flow._call(flow.Find(cache.core, LookupRequest(("p",), "s", 0.9, claim=True))))
    assert isinstance(load, flow.Load) and len(cache.core.flights) == 1
    with pytest.raises(KeyError):
        gen.throw(KeyError("the model is down"))
    assert len(cache.core.flights) == 0


def test_a_cancelled_waiter_leaves_the_load_and_the_other_waiters_alone(cache, monkeypatch):
    """Cancelling a task that waits on another call's load must not cancel the shared future:
    the loader finishes, the other waiters get its answer, and it is stored."""
    async def main() -> None:
        started, release, both_waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
        calls, waiting = [], []
        real_wait = flow.wait

        async def observed_wait(future):
            waiting.append(future)
            if len(waiting) == 2:
                both_waiting.set()
            return await real_wait(future)

        monkeypatch.setattr(flow, "wait", observed_wait)

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


def test_on_lookup_says_hit_or_miss_before_any_load_or_chunk(cache):
    seen = []

    def loader(prompt):
        seen.append("loaded")
        return "an answer"

    assert cache.get_or_put("what is a monad", loader, on_lookup=seen.append) == "an answer"
    assert seen == [None, "loaded"]  # the miss was reported before the loader ran
    seen.clear()
    cache.get_or_put("what is a monad", loader, on_lookup=seen.append)
    assert [(h.exact, h.response) for h in seen] == [(True, "an answer")]
    seen.clear()
    chunks = cache.get_or_put_streaming("What is a monad?", lambda p: iter(["x"]), on_lookup=seen.append)
    assert "".join(chunks) == "an answer"
    assert len(seen) == 1 and not seen[0].exact and seen[0].cached_prompt == "what is a monad"

    async def main():
        reported = []

        async def aloader(prompt):
            reported.append("loaded")
            return "async answer"

        await cache.aget_or_put("a new question", aloader, on_lookup=reported.append)

        async def chunks(prompt):
            yield "streamed"

        streamed = [c async for c in cache.aget_or_put_streaming(
            "another new question", chunks, on_lookup=reported.append)]
        return reported, streamed

    reported, streamed = asyncio.run(main())
    assert reported == [None, "loaded", None] and streamed == ["streamed"]
    with pytest.raises(TypeError, match="on_lookup"):
        cache.get_or_put("q", loader, on_lookup="not callable")


def test_a_loaded_answer_lives_the_ttl_its_call_gave(fake_embedder):
    now = [0.0]
    cache = SemanticCache(fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.9,
                          cache_policy=StoreEverything(), ttl=1000.0, timer=lambda: now[0])
    cache.get_or_put("short lived", lambda p: "a", ttl=10)
    cache.get_or_put("long lived", lambda p: "b")
    now[0] = 11.0
    assert cache.get("short lived") is None and cache.get("long lived").response == "b"
    with pytest.raises(ValueError, match="ttl"):
        cache.get_or_put("q", lambda p: "x", ttl=-1)


# --------------------------------------------------------------------- serve, do not keep


def test_an_unstored_answer_reaches_its_caller_and_nothing_is_kept(cache):
    from gpucache import Unstored

    refused = Unstored({"status": 500})
    assert cache.get_or_put("is the model up", lambda p: refused) is refused
    answers = cache.get_or_put_all(["kept one", "not kept"],
                                   lambda ps: ["an answer" if p == "kept one" else Unstored("error") for p in ps])
    assert answers == ["an answer", Unstored("error")]
    assert cache.get("kept one").response == "an answer"
    assert cache.get("is the model up") is None and cache.get("not kept") is None
    assert len(cache.core.flights) == 0  # every claim released


def test_a_stream_that_ends_unstored_is_served_whole_and_kept_from_everyone(cache):
    from gpucache import Unstored

    def truncated(prompt):
        yield "once upon "
        yield "a time"
        yield Unstored()  # the loader's last item: not passed on

    assert list(cache.get_or_put_streaming("tell me a story", truncated)) == ["once upon ", "a time"]
    assert cache.get("tell me a story") is None and len(cache.core.flights) == 0

    async def consume():
        async def agen(prompt):
            yield "half a"
            yield Unstored("finish_reason length")

        return [piece async for piece in cache.aget_or_put_streaming("tell me another", agen)]

    assert asyncio.run(consume()) == ["half a"] and cache.get("tell me another") is None


def test_waiters_on_an_unstored_load_load_their_own_and_never_see_it(cache):
    """An answer that is not kept is never handed to another caller, JSON or stream: the
    waiters run their own load, as after a load that was abandoned."""
    from gpucache import Unstored

    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()
        calls: list[str] = []

        async def loader(prompt: str):
            calls.append(prompt)
            if len(calls) == 1:
                started.set()
                await release.wait()
                return Unstored("the leader's private error")
            return "the waiter's own answer"

        leader = asyncio.create_task(cache.aget_or_put("a flaky question", loader))
        await started.wait()
        waiter = asyncio.create_task(cache.aget_or_put("a flaky question", loader))
        assert await asyncio.to_thread(cache.core.flights.wait_for_joins, 1, 30)  # the waiter joined
        release.set()
        assert await leader == Unstored("the leader's private error")
        assert await waiter == "the waiter's own answer" and len(calls) == 2
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
        assert len(cache.core.flights) == 0
        assert await cache.aget_or_put("an endless question", lambda p: asyncio.sleep(0, "loaded")) == "loaded"

    asyncio.run(main())


def test_a_stream_cancelled_while_its_answer_is_handed_on_still_releases_its_claim(cache):
    """A client that goes away just as its streamed load ends: the bookkeeping that stores the
    answer and hands it to waiters is queued for a worker thread when the task is cancelled.
    It still runs, so the claim is released and the next caller of the prompt is not left
    waiting on it for good (a proxy once hung on exactly this)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    finished = threading.Event()
    real_finish = cache.core.finish

    def finish(*args, **kwargs):
        real_finish(*args, **kwargs)
        finished.set()

    cache.core.finish = finish
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
    assert len(cache.core.flights) == 0
    assert cache.get("a question").response == "the only part"


def run_async(coro):
    return asyncio.run(coro)
