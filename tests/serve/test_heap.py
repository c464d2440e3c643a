"""What a server's start-up loaded is frozen out of the collector's full collections while it
serves (gpucache/serve/heap.py), and given back at shutdown: a full collection, which holds
the GIL and so the event loop answering repeats, walks only what was made while serving."""

from __future__ import annotations

import gc

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serving import Served, make_upstream  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402


def tracked(obj: object) -> bool:
    """Whether a collection walks ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def walked() -> int:
    """How many objects a full collection walks now: those in the three generations."""
    gc.collect()
    return len(gc.get_objects())


def test_a_served_cache_is_frozen_while_serving_and_thawed_after(real_embedder):
    frozen_before = gc.get_freeze_count()
    made: list[SemanticCache] = []

    def factory() -> SemanticCache:
        made.append(SemanticCache(real_embedder, device="cpu", lookup_window_seconds=0.002))
        return made[0]

    with Served(make_upstream()) as upstream:
        config = ServeSettings(upstream=f"{upstream.url}/v1", namespace_secret=b"a-secret-for-the-heap-test")
        with Served(create_app(config, cache_factory=factory)) as served:
            assert httpx.get(f"{served.url}/health", timeout=60).status_code == 200
            frozen = served.app.state.frozen
            assert frozen.objects > frozen_before and gc.get_freeze_count() > frozen_before
            # the cache and the model it was built with: alive all along, never walked
            assert not tracked(made[0]) and not tracked(real_embedder)
        assert gc.get_freeze_count() == frozen_before  # the process's collector as it was
        assert tracked(made[0])


def test_a_full_collection_while_serving_walks_only_what_serving_made(real_embedder):
    """What every full collection walks, with the GIL held and so the loop waiting, counted in
    this process before the server starts (the model loaded, nothing frozen) and while it
    serves: a fraction of it. Counted, not timed: the time follows the count."""
    real_embedder.encode(["a prompt to settle the model's first call"])
    before = walked()
    with Served(make_upstream()) as upstream:
        config = ServeSettings(upstream=f"{upstream.url}/v1", namespace_secret=b"a-secret-for-the-heap-test")
        app = create_app(config, cache_factory=lambda: SemanticCache(real_embedder, device="cpu"))
        with Served(app) as served:
            assert httpx.get(f"{served.url}/health", timeout=60).status_code == 200
            serving = walked()
    assert serving < before / 4, (serving, before)
