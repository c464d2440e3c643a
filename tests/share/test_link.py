"""The link's breaker: one state for every thread that uses Redis, changed under the link's
condition, with redis-py's exponential backoff between tries."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("redis")

from gpucache.share.link import Breaker, ShareStats  # noqa: E402


def breaker() -> tuple[Breaker, ShareStats, threading.Condition]:
    stats, changed = ShareStats(), threading.Condition()
    return Breaker(stats, changed), stats, changed


def test_each_failure_since_the_last_success_waits_twice_as_long_up_to_two_seconds():
    b, stats, _ = breaker()
    assert [b.trip() for _ in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert stats.errors == 8 and not b.connected
    b.succeeded()
    assert b.connected and b.trip() == 0.05  # a success starts the waits over


def test_a_waiter_on_the_link_sees_the_breaker_open_and_close():
    b, stats, changed = breaker()
    b.succeeded()
    opened = threading.Event()

    def watch() -> None:
        with changed:
            changed.wait_for(lambda: not stats.connected)
        opened.set()
        with changed:
            changed.wait_for(lambda: stats.connected)

    watcher = threading.Thread(target=watch)
    watcher.start()
    b.trip()
    assert opened.wait(10)
    b.succeeded()
    watcher.join(10)
    assert not watcher.is_alive()
