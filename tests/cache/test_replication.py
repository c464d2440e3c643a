"""The seam between a cache and its other replicas (gpucache/cache/replication.py): the cache
calls its replication at every point where other replicas matter, a replication applies their
entries through the cache's public face only, and the default is a cache alone."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from gpucache import SemanticCache, StoreEverything, ThresholdOnly
from gpucache.cache.replication import LocalOnly, RemovalFence, SharedEntry


class Recording(LocalOnly):
    """A replication that records what the cache told it, and hands out entries of its own."""

    remote = True

    def __init__(self, elsewhere=()):
        self.calls, self.elsewhere, self.replica = [], list(elsewhere), None

    def attach(self, replica):
        self.replica = replica

    def stored(self, scope, items, vectors, expires_at):
        self.calls.append(("stored", scope, [p for p, _ in items]))

    def removed(self, scope, prompt):
        self.calls.append(("removed", scope, prompt))

    def cleared(self, scope, under=False):
        self.calls.append(("cleared_under" if under else "cleared", scope))

    def fetch(self, pairs):
        return [e for e in self.elsewhere if (e.scope, e.prompt) in pairs]


def make(embedder, shared=None):
    return SemanticCache(
        embedder,
        device="cpu",
        verifier=ThresholdOnly(),
        threshold=0.9,
        cache_policy=StoreEverything(),
        shared=shared,
    )


def test_a_cache_alone_has_the_local_only_replication(fake_embedder):
    cache = make(fake_embedder)
    assert isinstance(cache.shared, LocalOnly) and not cache.shared.remote
    assert cache.get_or_put("a question", lambda p: "an answer") == "an answer"
    assert cache.get("a question").exact


def test_the_cache_tells_its_replication_and_takes_entries_through_its_public_face(fake_embedder):
    vector = fake_embedder.encode(["stored elsewhere"])[0]
    shared = Recording([SharedEntry("s", "stored elsewhere", "their answer", math.inf, vector)])
    cache = make(fake_embedder, shared)
    assert shared.replica is cache._core.replica  # the replica face: apply_replicated* (replicated.py)
    cache.put("mine", "my answer", scope="s")
    cache.invalidate("mine", scope="s")
    cache.clear("s")
    assert shared.calls == [("stored", "s", ["mine"]), ("removed", "s", "mine"), ("cleared", "s")]
    # an exact repeat another replica stored, answered from it and kept here
    assert cache.get_or_put("stored elsewhere", lambda p: "loaded", scope="s") == "their answer"
    shared.elsewhere.clear()  # the other replica invalidated it: its removal arrives
    shared.replica.apply_replicated_removal("s", "stored elsewhere")
    assert cache.get("stored elsewhere", scope="s") is None


class RemovedWhileRead(Recording):
    """A replication whose read from the shared store is overtaken by a removal: ``during``
    runs while the round trip is in flight (another thread's clear, or another replica's)."""

    def __init__(self, elsewhere, during):
        super().__init__(elsewhere)
        self.during = during

    def fetch(self, pairs):
        found = super().fetch(pairs)  # read before the removal...
        self.during(self.replica)  # ...which is applied before the read is
        return found


@pytest.mark.parametrize(
    "removal",
    [
        lambda replica: replica.core.upkeep.clear("s"),
        lambda replica: replica.core.upkeep.invalidate("s", "stored elsewhere"),
        lambda replica: replica.apply_replicated_clear(None),
        lambda replica: replica.apply_replicated_removal("s", "stored elsewhere"),
    ],
    ids=["clear", "invalidate", "replicated clear", "replicated removal"],
)
def test_an_entry_read_from_the_shared_store_before_a_removal_is_not_kept_after_it(fake_embedder, removal):
    vector = fake_embedder.encode(["stored elsewhere"])[0]
    entry = SharedEntry("s", "stored elsewhere", "their answer", math.inf, vector)
    cache = make(fake_embedder, RemovedWhileRead([entry], removal))
    assert cache.get("stored elsewhere", scope="s") is None  # the removal stands
    cache.shared.during = lambda replica: None
    cache.shared.elsewhere.clear()
    assert cache.get("stored elsewhere", scope="s") is None  # and nothing was kept here


def test_a_removal_of_something_else_leaves_a_read_from_the_shared_store_alone(fake_embedder):
    vector = fake_embedder.encode(["stored elsewhere"])[0]
    entry = SharedEntry("s", "stored elsewhere", "their answer", math.inf, vector)
    cache = make(fake_embedder, RemovedWhileRead([entry], lambda replica: replica.core.upkeep.clear("other")))
    hit = cache.get("stored elsewhere", scope="s")
    assert hit is not None and hit.exact and hit.response == "their answer"


def test_a_clear_under_a_prefix_is_announced_once_whatever_this_cache_holds(fake_embedder):
    """Another replica may hold scopes under the prefix that this one never saw: the clear is of
    the prefix, not of the scopes found here."""
    shared = Recording()
    cache = make(fake_embedder, shared)
    cache.put("one of theirs", "x", scope="key:ab/ns:one")
    cache.put("one of theirs too", "y", scope="key:ab/ns:two")
    assert cache.clear_under("key:ab") == 2
    assert cache.clear_under("key:cd") == 0
    assert [c for c in shared.calls if c[0] != "stored"] == [
        ("cleared_under", "key:ab"),
        ("cleared_under", "key:cd"),
    ]


def test_the_fence_covers_what_each_removal_since_the_mark_removed():
    fence = RemovalFence()
    fence.removed("s", "before")
    since = fence.mark()
    assert not fence.stale("s", "before", since)  # applied before the read began
    fence.removed("s", "a")
    assert fence.stale("s", "a", since) and not fence.stale("s", "b", since)
    assert not fence.stale("t", "a", since)
    fence.cleared("t")
    assert fence.stale("t", "anything", since) and not fence.stale("u", "x", since)
    assert not fence.stale("t/ns:x", "a", since)  # a clear of one scope only
    fence.cleared("t", under=True)
    assert fence.stale("t/ns:x", "a", since) and not fence.stale("tx", "a", since)
    fence.cleared(None)
    assert fence.stale("u", "x", since)


def test_a_read_older_than_every_removal_the_fence_keeps_is_dropped():
    fence = RemovalFence()
    since = fence.mark()
    for i in range(RemovalFence.KEPT + 1):
        fence.removed("s", f"prompt {i}")
    assert fence.stale("other scope", "never removed", since)  # it cannot tell: nothing kept
    assert not fence.stale("other scope", "never removed", fence.mark())


def test_the_cache_package_never_imports_a_replication():
    root = Path(__file__).resolve().parents[2] / "gpucache" / "cache"
    for source in root.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("gpucache.share"), source.name


class LoadingElsewhere(Recording):
    """A replication where another replica is loading every miss, and never finishes."""

    def __init__(self):
        super().__init__()
        import asyncio

        self.waiting = asyncio.Event()
        self.released = []

    def claim(self, scope, prompts):
        return {}, list(prompts)

    async def await_loaded(self, scope, prompts):
        import asyncio

        self.waiting.set()
        await asyncio.Event().wait()

    def release(self, scope, claims):
        self.released.append(claims)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_call_cancelled_while_another_replica_loads_releases_its_claims(fake_embedder, streamed):
    """A request that goes away while it waits on another replica's load (its client hung up)
    gives up its claims here: the next caller of the prompt loads instead of waiting on it."""
    import asyncio

    async def main():
        shared = LoadingElsewhere()
        cache = make(fake_embedder, shared)

        async def loader(prompt):
            return "loaded"

        if streamed:
            call = cache.aget_or_load_streaming("a question", lambda p: pytest.fail("not opened"))
        else:
            call = cache.aget_or_put("a question", loader)
        task = asyncio.ensure_future(call)
        await shared.waiting.wait()
        assert len(cache._core.flights) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return len(cache._core.flights)

    assert asyncio.run(main()) == 0
