"""Single-flight: concurrent misses on the same (scope, prompt) run the loader once.

A miss on a popular prompt tends to arrive many times at once (a burst of users, a retry
storm). Without coordination every one of them calls the model. The first caller to miss a key
claims it and loads; later callers get the claimant's ``Future`` and wait on it. If the load
fails, every waiter receives the same exception and nothing is stored.

The table has a lock of its own, held only for a dict operation: the async drivers release a
claim on the event loop (a cancelled task must release it at once), and the cache's lock, which
a scan holds, must never be waited on there. Waiting on a future happens outside any lock.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable
from concurrent.futures import Future
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LoadAbandoned(RuntimeError):
    """The call loading a prompt gave up before its load completed: its stream's consumer
    stopped reading, or its asyncio task was cancelled. Calls that were waiting for that load
    run their own instead; callers never see this error."""


class SingleFlight(Generic[K, V]):
    """Claims on keys being loaded; safe to call from any thread."""

    def __init__(self) -> None:
        self._inflight: dict[K, Future[V]] = {}
        self._lock = threading.Lock()
        self._joined = threading.Condition(self._lock)
        self.joins = 0  # claims that found their key in flight and waited on its load

    def wait_for_joins(self, n: int, timeout: float | None = None) -> bool:
        """Block until ``n`` claims in all have joined a load in flight; False on timeout.
        For tests and diagnostics: "the other caller is waiting on my load" is an event."""
        with self._joined:
            return self._joined.wait_for(lambda: self.joins >= n, timeout)

    def __len__(self) -> int:
        return len(self._inflight)

    def claim(self, keys: Iterable[K]) -> tuple[list[K], dict[K, Future[V]]]:
        """Split ``keys`` into those this caller must load and the futures of those in flight."""
        mine: list[K] = []
        theirs: dict[K, Future[V]] = {}
        with self._lock:
            for key in keys:
                if key in self._inflight:
                    theirs[key] = self._inflight[key]
                else:
                    self._inflight[key] = Future()
                    mine.append(key)
            if theirs:
                self.joins += len(theirs)
                self._joined.notify_all()
        return mine, theirs

    def resolve(self, results: dict[K, V]) -> None:
        """Hand each claimed key's result to its waiters and release the claim."""
        with self._lock:
            futures = [(self._inflight.pop(key), value) for key, value in results.items()]
        for future, value in futures:  # runs waiters' callbacks: outside the lock
            future.set_result(value)

    def fail(self, keys: Iterable[K], error: BaseException) -> None:
        """Hand ``error`` to the waiters of every claimed key and release the claims."""
        with self._lock:
            futures = [self._inflight.pop(key, None) for key in keys]
        for future in futures:
            if future is not None:
                future.set_exception(error)
