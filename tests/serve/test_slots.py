"""The proxy's slots (``gpucache.serve.slots``): a credential's share of the cache's lookups
binds only while another credential is active, for a window after it was last heard from, and a
request leaves it when it goes upstream; the global bound always binds."""

from __future__ import annotations

import asyncio

import pytest

from gpucache.serve.slots import Slots


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def in_company(limit: int = 10, share: int = 1) -> Slots:
    """Slots with two credentials heard from: each held to its share."""
    slots = Slots(limit=limit, share=share, clock=Clock())
    slots.seen("key:a")
    slots.seen("key:b")
    return slots


def holding(slots: Slots, holder: str, n: int):
    """``n`` slots held for ``holder``: context managers entered, which the caller keeps (a
    collected one is closed, and gives its slot back) and may exit."""
    held = [slots.held(holder) for _ in range(n)]
    for h in held:
        h.__enter__()
    return held


def test_a_credential_alone_is_never_held_to_its_share():
    clock = Clock()
    slots = Slots(limit=100, share=2, clock=clock)
    slots.seen("key:a")
    a_holds = holding(slots, "key:a", 5)  # noqa: F841
    assert not slots.at_share("key:a") and not slots.full()


def test_once_another_credential_is_heard_from_each_holds_at_most_its_share():
    clock = Clock()
    slots = Slots(limit=100, share=2, company_seconds=30.0, clock=clock)
    slots.seen("key:a")
    a_holds = holding(slots, "key:a", 2)  # noqa: F841
    slots.seen("key:b")
    assert slots.at_share("key:a")
    assert not slots.at_share("key:b")  # holds none
    b_holds = holding(slots, "key:b", 2)  # noqa: F841
    assert slots.at_share("key:b")


def test_the_share_binds_for_the_window_after_the_other_was_last_heard_from():
    clock = Clock()
    slots = Slots(limit=100, share=1, company_seconds=30.0, clock=clock)
    slots.seen("key:a")
    a_holds = holding(slots, "key:a", 3)  # noqa: F841
    slots.seen("key:b")
    clock.now += 29.9
    assert slots.at_share("key:a")  # b still active
    clock.now += 0.1
    assert not slots.at_share("key:a")  # b quiet for the window (30 s exactly): a is alone again


def test_a_credential_that_keeps_asking_stays_active():
    clock = Clock()
    slots = Slots(limit=100, share=1, company_seconds=30.0, clock=clock)
    slots.seen("key:a")
    a_holds = holding(slots, "key:a", 1)  # noqa: F841
    for _ in range(5):
        slots.seen("key:b")
        clock.now += 20.0
        assert slots.at_share("key:a")


def test_no_share_never_binds_and_the_global_bound_always_does():
    clock = Clock()
    slots = Slots(limit=3, share=None, clock=clock)
    slots.seen("key:a")
    slots.seen("key:b")
    held = holding(slots, "key:a", 3)
    assert not slots.at_share("key:a")
    assert slots.full()  # the limit, whoever asks
    held[0].__exit__(None, None, None)
    assert not slots.full() and slots.busy == 2


def test_slots_are_given_back_when_the_block_ends_or_fails():
    slots = in_company(limit=2, share=1)
    with pytest.raises(RuntimeError):
        with slots.held("key:a"):
            assert slots.busy == 1 and slots.sharing("key:a") == 1
            raise RuntimeError("the upstream failed")
    assert slots.busy == 0 and slots.sharing("key:a") == 0 and not slots.at_share("key:a")


def test_credentials_quiet_past_the_window_are_forgotten():
    """Many keys each sending once cost memory for the window only."""
    clock = Clock()
    slots = Slots(limit=10, share=1, company_seconds=30.0, clock=clock)
    for i in range(10_000):
        slots.seen(f"key:{i}")
        clock.now += 0.01
    clock.now += 30.0
    slots.seen("key:last")
    assert len(slots._heard) == 1


def test_a_request_at_its_share_waits_for_its_own_slot_not_another_credentials():
    """``turn``: a credential at its share waits until one of its own slots is given back; a
    slot another credential gives back does not wake it."""

    async def main() -> tuple[bool, bool, bool]:
        slots = in_company(limit=100, share=1)
        a_slot, b_slot = slots.held("key:a"), slots.held("key:b")
        a_slot.__enter__()
        b_slot.__enter__()
        waiting = asyncio.ensure_future(slots.turn("key:a", 60.0))
        await asyncio.sleep(0)  # the waiter queued
        b_slot.__exit__(None, None, None)
        await asyncio.sleep(0)
        woken_by_other = waiting.done()
        a_slot.__exit__(None, None, None)
        return woken_by_other, await waiting, slots.at_share("key:a")

    woken_by_other, turned, at_share = asyncio.run(main())
    assert not woken_by_other and turned and not at_share


def test_a_request_whose_turn_does_not_come_in_time_is_refused_and_forgotten():
    async def main() -> tuple[bool, int]:
        slots = in_company(limit=100, share=1)
        with slots.held("key:a"):
            turned = await slots.turn("key:a", 0.01)
            return turned, slots.waiting

    assert asyncio.run(main()) == (False, 0)


def test_at_most_limit_requests_wait_each_slot_wakes_one_and_a_cancelled_wait_is_forgotten():
    async def main() -> tuple[bool, bool, bool, int, int]:
        slots = in_company(limit=3, share=1)
        held = slots.held("key:a")
        held.__enter__()
        waiters = [asyncio.ensure_future(slots.turn("key:a", 60.0)) for _ in range(3)]
        await asyncio.sleep(0)
        fourth = await slots.turn("key:a", 60.0)  # three wait already: refused without waiting
        no_wait = await slots.turn("key:a", 0)  # no time to wait: refused at once
        held.__exit__(None, None, None)  # one slot back: the first waiter's turn, only its
        first = await waiters[0]
        still = sum(not w.done() for w in waiters[1:])
        for w in waiters[1:]:  # their clients hang up
            w.cancel()
        await asyncio.gather(*waiters[1:], return_exceptions=True)
        return fourth, no_wait, first, still, slots.waiting

    assert asyncio.run(main()) == (False, False, True, 2, 0)


def test_a_request_gone_upstream_leaves_the_share_and_keeps_its_slot():
    """What is shared is the embedder: a credential's requests waiting on the model server do
    not hold its later ones back from their lookups (a tenant's 32 workers keep 32 generations
    running), while the global bound still counts them."""

    async def main() -> tuple[bool, int, int, bool, int]:
        slots = in_company(limit=10, share=1)
        with slots.held("key:a"):
            at_share_in_lookup = slots.at_share("key:a")
            slots.upstream_bound()
            slots.upstream_bound()  # a second call (a stream reopened) gives nothing more back
            sharing, busy = slots.sharing("key:a"), slots.busy
            next_one = await slots.turn("key:a", 0)
            with slots.held("key:a"):
                both = slots.busy
        return at_share_in_lookup, sharing, busy, next_one, both

    assert asyncio.run(main()) == (True, 0, 1, True, 2)


@pytest.mark.parametrize("seconds", [60.0, 0.5], ids=["a minute", "within a second"])
def test_going_upstream_wakes_the_next_request_waiting_for_the_share(seconds):
    async def main() -> bool:
        slots = in_company(limit=10, share=1)
        with slots.held("key:a"):
            waiting = asyncio.ensure_future(slots.turn("key:a", seconds))
            await asyncio.sleep(0)
            slots.upstream_bound()
            return await waiting

    assert asyncio.run(main()) is True


def test_a_place_given_back_counts_one_off_the_credentials_share():
    slots = in_company(limit=10, share=2)
    first, second = slots.held("key:a"), slots.held("key:a")
    first.__enter__()
    second.__enter__()
    assert slots.sharing("key:a") == 2 and slots.at_share("key:a")
    first.__exit__(None, None, None)
    assert slots.sharing("key:a") == 1 and not slots.at_share("key:a")
    second.__exit__(None, None, None)
    assert slots.sharing("key:a") == 0


def test_one_place_wakes_one_waiter_and_the_rest_keep_waiting():
    """A place given back is one request's turn: the next waiter is not woken to find the
    share full and be refused."""

    async def main() -> tuple[bool, bool, int]:
        slots = in_company(limit=10, share=1)
        held = slots.held("key:a")
        held.__enter__()
        waiters = [asyncio.ensure_future(slots.turn("key:a", 60.0)) for _ in range(2)]
        await asyncio.sleep(0)
        held.__exit__(None, None, None)
        first = await waiters[0]
        with slots.held("key:a"):  # the first takes its place
            for _ in range(3):
                await asyncio.sleep(0)
            second_done = waiters[1].done()
            waiting = slots.waiting
        waiters[1].cancel()
        await asyncio.gather(waiters[1], return_exceptions=True)
        return first, second_done, waiting

    assert asyncio.run(main()) == (True, False, 1)


def test_a_waiter_that_gives_up_passes_nothing_on_and_leaves_the_others_queued():
    """One request's wait ends (its deadline) while another's goes on: the other is neither
    woken for nothing nor lost from the queue, and a place given back later is its turn."""

    async def main() -> tuple[bool, bool, bool, bool]:
        slots = in_company(limit=10, share=1)
        held = slots.held("key:a")
        held.__enter__()
        patient = asyncio.ensure_future(slots.turn("key:a", 60.0))
        await asyncio.sleep(0)
        hasty = await slots.turn("key:a", 0.01)  # queued behind the patient one; gives up
        for _ in range(3):  # a patient one woken for nothing would run now, and be refused
            await asyncio.sleep(0)
        still_waiting = not patient.done()
        held.__exit__(None, None, None)
        turned = await patient
        return hasty, still_waiting, turned, not slots._waiting

    assert asyncio.run(main()) == (False, True, True, True)


def test_a_place_freed_as_its_waiter_is_cancelled_goes_to_exactly_one_request():
    """The first waiter is woken and cancelled (its client hung up) in the same instant: the
    place goes to it, where the cancel came too late to stop it (Python 3.11's ``wait_for``
    returns a result that is in), or else to the next waiter; never to both, never to none."""

    async def main() -> list[bool]:
        slots = in_company(limit=10, share=1)
        held = slots.held("key:a")
        held.__enter__()
        gone, next_one = (asyncio.ensure_future(slots.turn("key:a", 60.0)) for _ in range(2))
        await asyncio.sleep(0)
        held.__exit__(None, None, None)
        gone.cancel()
        took = []
        for task in (gone, next_one):
            try:
                took.append(await asyncio.wait_for(asyncio.shield(task), 1))
            except (asyncio.CancelledError, asyncio.TimeoutError):
                took.append(False)
        next_one.cancel()
        await asyncio.gather(next_one, return_exceptions=True)
        return took

    assert sorted(asyncio.run(main())) == [False, True]
