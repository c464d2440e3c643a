"""Concurrent async lookups coalesced into one batch (gpucache/cache/batching.py): one embedder
call and one scan per scope for the batch, and for each caller exactly the answer it would have
got alone. A caller that gives up leaves no claim behind."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpucache import LookupTimeout, SemanticCache, StoreEverything, ThresholdOnly


def make(embedder, **options) -> SemanticCache:
    return SemanticCache(
        embedder,
        device="cpu",
        verifier=ThresholdOnly(),
        threshold=0.9,
        cache_policy=StoreEverything(),
        **options,
    )


class HeldEmbedder:
    """The fake embedder, each ``encode`` call held inside it until released, and its texts
    recorded (``batches``, a list per call): a test sees what was computed together, and acts
    while a batch is in the embedder."""

    def __init__(self, inner):
        self.inner, self.name, self.dim, self.device = inner, inner.name, inner.dim, inner.device
        self.batches: list[list[str]] = []
        self._let_out = 0
        self._changed = threading.Condition()

    def encode(self, texts):
        with self._changed:
            self.batches.append(list(texts))
            call = len(self.batches)
            self._changed.notify_all()
            assert self._changed.wait_for(lambda: self._let_out >= call, 10)
        return self.inner.encode(texts)

    def entered(self, calls: int = 1) -> bool:
        """From a thread: wait until the ``calls``-th call has come into ``encode``."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.batches) >= calls, 10)

    def release(self, calls: int = 10**9) -> None:
        """Let the first ``calls`` calls out of ``encode`` (by default all, now and later)."""
        with self._changed:
            self._let_out = calls
            self._changed.notify_all()

    def hold(self) -> None:
        """Hold the calls from now on (those made so far were let out)."""
        self.release(len(self.batches))


async def behind_a_running_batch(cache, held, *lookups):
    """``lookups`` (coroutines) submitted while another lookup's batch is in the embedder, then
    that batch released: their results, and the batches the embedder saw."""
    running = asyncio.ensure_future(cache.aget("the batch in the embedder"))
    assert await asyncio.to_thread(held.entered, len(held.batches) + 1)
    gathered = [asyncio.ensure_future(lookup) for lookup in lookups]
    await asyncio.sleep(0)  # one turn of the loop (no wait): each runs to its await in submit
    held.release()
    assert await running is None
    return await asyncio.gather(*gathered, return_exceptions=True)


def test_a_lone_lookup_is_sent_at_once_without_waiting_for_company(fake_embedder):
    """No batch is computing, so nobody is gathering: the lookup goes into the embedder as it
    is submitted, not when a window closes (1 s here, the longest allowed)."""
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=1.0)

    async def main():
        lone = asyncio.ensure_future(cache.aget("a lone question"))
        await asyncio.sleep(0)  # one turn of the loop (no wait): the lookup runs to its await
        sent = cache._core.batches  # sent as it was submitted: no timer was set for it
        assert await asyncio.to_thread(held.entered)
        held.release()
        return sent, await lone

    assert run(main()) == (1, None)
    assert held.batches == [["a lone question"]]


def test_lookups_that_arrive_while_a_batch_computes_share_the_next(fake_embedder):
    """The batching gain under load: what gathers behind the batch in the embedder is sent as
    one batch the moment that batch returns."""
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=0.002, lookup_batch=64)
    prompts = [f"gathered question {i}" for i in range(5)]
    answers = run(behind_a_running_batch(cache, held, *(cache.aget(p) for p in prompts)))
    assert answers == [None] * 5
    assert held.batches == [["the batch in the embedder"], prompts]
    assert cache._core.batches == 2


def test_concurrent_lookups_share_one_embedder_call(fake_embedder):
    """Twelve at once: the exact hit needs no batch; the first new prompt is sent alone as it
    arrives; the ten that arrive while it computes share the next batch and its encode call."""
    cache = make(fake_embedder, lookup_window_seconds=0.05, lookup_batch=64)
    cache.warm([("what is a monad", "a monoid in the category of endofunctors")])
    calls_before = fake_embedder.calls

    async def main():
        async def loader(prompt):
            return f"loaded: {prompt}"

        prompts = ["what is a monad", "What is a monad?"] + [f"question {i}" for i in range(10)]
        return await asyncio.gather(*(cache.aget_or_put(p, loader) for p in prompts))

    answers = run(main())
    assert answers[:2] == ["a monoid in the category of endofunctors"] * 2  # exact, semantic
    assert answers[2:] == [f"loaded: question {i}" for i in range(10)]
    assert cache._core.batches == 2
    assert fake_embedder.calls - calls_before == 2  # stores reuse the lookups' vectors
    assert fake_embedder.texts[-11:] == ["What is a monad?"] + [f"question {i}" for i in range(10)]
    assert cache.stats().exact_hits == 1 and cache.stats().semantic_hits == 1


def test_a_batch_holds_at_most_lookup_batch_and_the_rest_go_next(fake_embedder):
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=1.0, lookup_batch=4)
    prompts = [f"prompt {i}" for i in range(6)]
    assert run(behind_a_running_batch(cache, held, *(cache.aget(p) for p in prompts))) == [None] * 6
    assert held.batches == [["the batch in the embedder"], prompts[:4], prompts[4:]]


def test_a_full_batch_is_filled_one_tenant_at_a_time_in_turn(fake_embedder):
    """One tenant's flood gathered ahead of another's lookup: the next batch takes each tenant
    in turn (each in arrival order), so the other's lookup goes in it, not after the flood."""
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=1.0, lookup_batch=4)
    flood = [cache.aget(f"flood {i}", scope=f"key:a/q:{i % 2}") for i in range(6)]
    lookups = [*flood, cache.aget("the other tenant's question", scope="key:b")]
    assert run(behind_a_running_batch(cache, held, *lookups)) == [None] * 7
    assert held.batches == [
        ["the batch in the embedder"],
        ["flood 0", "flood 1", "flood 2", "the other tenant's question"],
        ["flood 3", "flood 4", "flood 5"],
    ]


def test_in_turn_takes_tenants_in_the_order_they_first_came():
    from gpucache.cache.batching import _Ticket, in_turn
    from gpucache.cache.lookup import LookupRequest

    def ticket(scope, n):
        return _Ticket(LookupRequest((f"{scope} {n}",), scope, 0.9, claim=False), future=None)

    tickets = [
        ticket("a", 0),
        ticket("a/x", 1),
        ticket("b", 2),
        ticket("a", 3),
        ticket("c/q", 4),
        ticket("b", 5),
        ticket("c", 6),
    ]
    batch, rest = in_turn(tickets, 5)
    assert [t.request.prompts[0] for t in batch] == ["a 0", "a/x 1", "b 2", "c/q 4", "b 5"]
    assert [t.request.prompts[0] for t in rest] == ["a 3", "c 6"]
    assert in_turn(tickets, 7) == (tickets, [])


def test_scopes_in_one_batch_never_see_each_others_entries(fake_embedder):
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=0.05)
    held.release()
    cache.put("reset my password", "tenant a's answer", scope="a")
    held.hold()
    a, b, b_reworded = run(
        behind_a_running_batch(
            cache,
            held,
            cache.aget("Reset my password!", scope="a"),
            cache.aget("reset my password", scope="b"),
            cache.aget("Reset my password!", scope="b"),
        )
    )
    assert a.response == "tenant a's answer" and b is None and b_reworded is None
    assert len(held.batches) == 3  # the put's, the running one's, and the three's


def test_each_caller_keeps_its_own_threshold(fake_embedder):
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=0.05)
    held.release()
    cache.put("how do i bake bread", "knead, rise, bake")
    held.hold()
    strict, lenient = run(
        behind_a_running_batch(
            cache,
            held,
            cache.aget("how do i bake bread today", threshold=0.99),
            cache.aget("how do i bake bread today", threshold=0.5),
        )
    )
    assert strict is None and lenient.response == "knead, rise, bake"
    assert len(held.batches) == 3  # the put's, the running one's, and the two's


@pytest.mark.parametrize("window", [0.0, 0.01])
def test_a_lookup_past_its_timeout_claims_nothing_for_its_gone_caller(fake_embedder, window):
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=window, lookup_timeout_seconds=0.05)

    async def main():
        async def loader(prompt):
            return "loaded"

        with pytest.raises(LookupTimeout):
            await cache.aget_or_put("slow question", loader)
        held.release()  # the abandoned lookup finishes in its thread, and claims
        # a second caller is not left waiting on a load the first will never run
        return await cache.aget_or_put("slow question", loader)

    assert run(main()) == "loaded"
    assert len(cache._core.flights) == 0


def test_a_cancelled_caller_in_a_batch_leaves_the_others_their_answers(fake_embedder):
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=0.01)

    async def main():
        async def loader(prompt):
            return f"loaded: {prompt}"

        running = asyncio.ensure_future(cache.aget("the batch in the embedder"))
        assert await asyncio.to_thread(held.entered)
        quitter = asyncio.ensure_future(cache.aget_or_put("first", loader))
        stayer = asyncio.ensure_future(cache.aget_or_put("second", loader))
        await asyncio.sleep(0)  # one turn of the loop (no wait): both gather behind the first
        held.release(1)
        assert await running is None
        assert await asyncio.to_thread(held.entered, 2)  # their batch is in the embedder
        quitter.cancel()
        held.release()
        with pytest.raises(asyncio.CancelledError):
            await quitter
        second = await stayer
        return second, await cache.aget_or_put("first", loader)

    assert run(main()) == ("loaded: second", "loaded: first")
    assert held.batches[1] == ["first", "second"]
    assert len(cache._core.flights) == 0


def test_an_embedder_failure_reaches_every_caller_of_the_batch(fake_embedder):
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=0.05)

    async def main():
        running = asyncio.ensure_future(cache.aget("the batch in the embedder"))
        assert await asyncio.to_thread(held.entered)
        gathered = asyncio.gather(cache.aget("one"), cache.aget("two"), return_exceptions=True)
        await asyncio.sleep(0)  # one turn of the loop (no wait): both gather behind the first
        fake_embedder.fail_with = RuntimeError("CUDA error: device-side assert")
        held.release()
        return [*await asyncio.gather(running, return_exceptions=True), *await gathered]

    errors = run(main())
    assert held.batches[1:] == [["one", "two"]] and len(errors) == 3
    assert all(isinstance(e, RuntimeError) and "device-side" in str(e) for e in errors)
    fake_embedder.fail_with = None
    assert run(cache.aget("one")) is None  # and the cache goes on


def run(coro):
    return asyncio.run(coro)


def test_an_exact_repeat_is_answered_on_the_spot_without_a_batch(fake_embedder):
    """A repeat needs a dictionary lookup: where the cache's lock is free it is answered on
    the event loop at once, with no lookup window, thread hop, batch or embedding; counted
    and remembered as any exact hit."""
    cache = make(fake_embedder, lookup_window_seconds=1.0)  # a window no repeat should wait out
    cache.put("a stored question", "its answer")
    calls = fake_embedder.calls

    async def main():
        async def loader(prompt):
            raise AssertionError("a repeat never loads")

        gets = await asyncio.gather(*(cache.aget("a stored question") for _ in range(16)))
        loads = await asyncio.gather(*(cache.aget_or_put("a stored question", loader) for _ in range(16)))
        streamed = [piece async for piece in cache.aget_or_put_streaming("a stored question", loader)]
        return gets, loads, "".join(streamed)

    gets, loads, streamed = run(main())
    assert all(h.exact and h.response == "its answer" for h in gets)
    assert loads == ["its answer"] * 16 and streamed == "its answer"
    assert cache._core.batches == 0 and fake_embedder.calls == calls
    assert cache.stats().exact_hits == 33


def hold_the_lock(cache):
    """A thread holding the cache's lock as a store or a long scan does, until released."""
    held, release = threading.Event(), threading.Event()

    def scan_in_progress():
        with cache._core.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=scan_in_progress)
    holder.start()
    assert held.wait(30)
    return holder, release


def test_a_repeat_is_answered_while_a_store_holds_the_lock_and_counted_once_it_is_free(fake_embedder):
    """While a store or a scan holds the lock, a live repeat is read without it and answered
    at once, on the loop: it never waits for the lock, nor queues behind the embedder. Its
    count, its recency and its sighting follow once the lock is free. A new prompt always takes
    a batch."""
    cache = make(fake_embedder, lookup_window_seconds=0.0, capacity=2)
    cache.put("a stored question", "its answer")
    cache.put("another stored question", "another answer")
    holder, release = hold_the_lock(cache)

    async def main():
        hit = await cache.aget("a stored question")  # answered with the lock still held
        assert cache._core.lock.acquire(blocking=False) is False
        loaded = await cache.aget_or_load("a stored question", lambda p: "never loaded")
        release.set()
        return hit, loaded, await cache.aget("a new question")

    hit, loaded, new = run(main())
    holder.join(30)
    assert hit.exact and hit.response == "its answer" and loaded.hit.response == "its answer"
    assert new is None and cache._core.batches == 1
    assert cache.stats().exact_hits == 2 and cache.stats().misses == 1
    cache.put("a third question", "evicts the least recently used")  # capacity 2
    assert cache.get("a stored question") is not None  # it was touched: the other went
    assert cache.get("another stored question") is None


def test_a_repeat_read_without_the_lock_is_served_within_its_own_scope_only(fake_embedder):
    cache = make(fake_embedder, lookup_window_seconds=0.0)
    cache.put("a stored question", "tenant A's answer", scope="tenant-a")
    holder, release = hold_the_lock(cache)

    async def main():
        mine = await cache.aget("a stored question", scope="tenant-a")  # at once, lock held
        other = asyncio.create_task(cache.aget("a stored question", scope="tenant-b"))
        await asyncio.to_thread(lambda: None)
        assert not other.done()  # not a repeat of its own: it waits for a lookup
        release.set()
        return mine, await other

    mine, other = run(main())
    holder.join(30)
    assert mine.response == "tenant A's answer" and other is None


def test_a_repeat_the_lock_free_read_cannot_confirm_waits_for_the_lock(fake_embedder):
    """An entry expired by the time of the lookup is not served without the lock: the repeat
    waits for the lock in the exact tier's own thread (the loop runs on) and misses."""
    clock = [1000.0]
    cache = make(fake_embedder, lookup_window_seconds=0.0, timer=lambda: clock[0], ttl=10)
    cache.put("a stored question", "its answer")
    clock[0] += 11
    holder, release = hold_the_lock(cache)

    async def main():
        repeat = asyncio.create_task(cache.aget("a stored question"))
        await asyncio.to_thread(lambda: None)  # the loop runs on: the repeat did not block it
        assert not repeat.done()
        release.set()
        return await repeat

    assert run(main()) is None
    holder.join(30)


def test_the_lock_free_read_serves_nothing_dropped_or_replaced_meanwhile(fake_embedder):
    cache = make(fake_embedder)
    cache.put("a stored question", "its answer")
    table, now = cache._core.table, cache._core.now()
    assert table.peek("another scope", "a stored question", now) is None
    from gpucache import DEFAULT_SCOPE

    first = table.peek(DEFAULT_SCOPE, "a stored question", now)
    assert first is not None and first.response == "its answer"
    cache.put("a stored question", "a newer answer")
    assert table.peek(DEFAULT_SCOPE, "a stored question", now).response == "a newer answer"
    cache.invalidate("a stored question")
    assert table.peek(DEFAULT_SCOPE, "a stored question", now) is None


def test_a_lookup_whose_caller_gave_up_while_it_queued_is_never_computed(fake_embedder):
    """Under overload a lookup can pass its deadline before its batch is sent; embedding it
    anyway is work nobody waits for, and how a queue collapses. It is dropped."""
    held = HeldEmbedder(fake_embedder)
    cache = make(held, lookup_window_seconds=0.001, lookup_timeout_seconds=0.2)

    async def main():
        first = asyncio.ensure_future(cache.aget("the batch in the embedder"))
        assert await asyncio.to_thread(held.entered)  # that batch holds the embedder
        with pytest.raises(LookupTimeout):  # this one queued behind it past its deadline
            await cache.aget("a lookup nobody waits for any more")
        held.release()
        with pytest.raises(LookupTimeout):  # its batch was sent; its caller gave up too
            await first
        return await cache.aget("a later lookup")

    embedded_before = len(fake_embedder.texts)
    assert run(main()) is None
    embedded = fake_embedder.texts[embedded_before:]
    assert "a lookup nobody waits for any more" not in embedded
    assert "the batch in the embedder" in embedded and "a later lookup" in embedded


class PreparingVerifier:
    """Serves every candidate, recording what it was handed to score in a batch (``prepared``,
    with the reader it was handed under) and what it was then asked to judge (``judged``)."""

    name = "preparing"

    def __init__(self):
        self.prepared: list[tuple[str, list[tuple[str, str]]]] = []
        self.judged: list[tuple[str, str]] = []

    def prepare(self, pairs):
        from gpucache.guard.memo import current_reader

        self.prepared.append((current_reader(), list(pairs)))

    def verify(self, cached, new, similarity):
        self.judged.append((cached, new))
        return True


def test_a_verifier_that_scores_in_batches_is_handed_every_candidate_of_a_lookup_batch_first(fake_embedder):
    verifier = PreparingVerifier()
    cache = SemanticCache(
        fake_embedder, device="cpu", verifier=verifier, threshold=0.8, cache_policy=StoreEverything()
    )
    cache.put("crimson tide rowing club boat", "a")
    cache.put("lighthouse keeper cottage rent", "b")
    cache.put("lighthouse keeper cottage rent", "c", scope="other")
    asked = [
        "crimson tide rowing club boats boat",
        "lighthouse keeper cottage rent rent",
        "unrelated words entirely",
    ]
    hits = cache.get_all(asked)
    assert [h is not None for h in hits] == [True, True, False]
    assert verifier.prepared == [
        (
            "default",  # the scope as the reader: one batch for the scope, before any judgment
            [
                ("crimson tide rowing club boat", "crimson tide rowing club boats boat"),
                ("lighthouse keeper cottage rent", "lighthouse keeper cottage rent rent"),
            ],
        )
    ]
    assert verifier.judged == verifier.prepared[0][1]  # the same pairs, judged after
    verifier.prepared.clear()
    assert cache.get("lighthouse keeper cottage rent rent", threshold=0.999) is None  # below: not handed
    assert verifier.prepared == []
