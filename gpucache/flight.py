"""Single-flight: concurrent misses on the same (scope, prompt) run the loader once.

A miss on a popular prompt tends to arrive many times at once (a burst of users, a retry
storm). Without coordination every one of them calls the model. The first caller to miss a key
claims it and loads; later callers get the claimant's ``Future`` and wait on it. If the load
fails, every waiter receives the same exception and nothing is stored. The table is guarded by
the cache's lock; waiting happens outside it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from concurrent.futures import Future
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """Claims on keys being loaded. Call every method with the owner's lock held."""

    def __init__(self) -> None:
        self._inflight: dict[K, Future[V]] = {}

    def __len__(self) -> int:
        return len(self._inflight)

    def claim(self, keys: Iterable[K]) -> tuple[list[K], dict[K, Future[V]]]:
        """Split ``keys`` into those this caller must load and the futures of those in flight."""
        mine: list[K] = []
        theirs: dict[K, Future[V]] = {}
        for key in keys:
            if key in self._inflight:
                theirs[key] = self._inflight[key]
            else:
                self._inflight[key] = Future()
                mine.append(key)
        return mine, theirs

    def resolve(self, results: dict[K, V]) -> None:
        """Hand each claimed key's result to its waiters and release the claim."""
        for key, value in results.items():
            self._inflight.pop(key).set_result(value)

    def fail(self, keys: Iterable[K], error: BaseException) -> None:
        """Hand ``error`` to the waiters of every claimed key and release the claims."""
        for key in keys:
            future = self._inflight.pop(key, None)
            if future is not None:
                future.set_exception(error)
