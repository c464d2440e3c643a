"""The entry table (gpucache/cache/entries.py) over a real exact-scan index: what is kept, what is
evicted and counted, when an entry expires, and how the bounds on entries, text bytes and each
tenant's share hold at their edges."""

from __future__ import annotations

import pytest
import torch

from gpucache.cache.entries import EntryTable, tenant_of, text_size
from gpucache.cache.stats import StatsCounter
from gpucache.index.store import ExactScanStore

DIM = 8


def table(
    limit: int = 100, text_limit: int | None = None, tenant_limit: int | None = None, fair: bool = False
) -> EntryTable:
    return EntryTable(
        ExactScanStore(DIM, device="cpu"), limit, StatsCounter(), text_limit, tenant_limit, fair=fair
    )


def vectors(n: int) -> torch.Tensor:
    return torch.nn.functional.normalize(
        torch.randn(n, DIM, generator=torch.Generator().manual_seed(n)), dim=1
    )


def put(
    t: EntryTable, scope: str, *pairs: tuple[str, str], expires_at: float = float("inf"), now: float = 0.0
) -> int:
    return t.store(scope, list(pairs), vectors(len(pairs)), expires_at, now)


def prompts(t: EntryTable) -> list[str]:
    return [e.prompt for e in t]


def test_a_tenant_is_a_scopes_part_before_its_first_slash():
    assert tenant_of("alice/model-a/sys") == "alice"
    assert tenant_of("alice") == "alice"


def test_the_texts_held_are_the_sum_of_the_entries_sizes():
    t = table()
    assert t.text_bytes == 0
    put(t, "s", ("a question", "an answer"), ("another question", "x" * 50))
    assert t.text_bytes == text_size("a question", "an answer") + text_size("another question", "x" * 50)
    put(t, "s", ("a question", "a longer answer than before"))  # an update re-counts its entry
    assert t.text_bytes == text_size("a question", "a longer answer than before") + text_size(
        "another question", "x" * 50
    )
    t.clear()
    assert t.text_bytes == 0 and len(t) == 0


def test_stores_are_counted_across_calls_updates_included():
    t = table()
    assert put(t, "s", ("p1", "r1"), ("p2", "r2")) == 2
    assert put(t, "s", ("p1", "r1 again"), ("p2", "r2 again"), ("p3", "r3")) == 3  # two updates, one new
    assert t.stats.stores == 5


def test_an_entry_expires_at_its_expiry_time_not_after():
    t = table()
    put(t, "s", ("p", "r"), expires_at=10.0)
    entry = t.exact("s", "p", now=9.5)
    assert entry is not None and t.current(entry, now=9.5) == entry
    assert t.current(entry, now=10.0) is None
    assert t.exact("s", "p", now=10.0) is None
    assert t.stats.expirations == 1 and len(t) == 0
    put(t, "s", ("q", "r"), expires_at=20.0)
    assert t.exact("s", "q", now=20.0) is None
    assert t.stats.expirations == 2  # counted across lookups


def test_expired_entries_are_purged_and_counted_when_room_is_needed():
    t = table(limit=3)
    put(t, "s", ("old 1", "r"), ("old 2", "r"), expires_at=5.0)
    put(t, "s", ("new 1", "r"), now=6.0)  # within the limit: nothing purged yet
    assert len(t) == 3 and t.stats.expirations == 0
    put(t, "s", ("new 2", "r"), now=6.0)  # room needed: the expired go first, no live one is evicted
    assert prompts(t) == ["new 1", "new 2"]
    assert t.stats.expirations == 2 and t.stats.evictions == 0
    put(t, "s", ("new 3", "r"), expires_at=7.0, now=6.0)
    put(t, "s", ("new 4", "r"), ("new 5", "r"), now=8.0)
    assert t.stats.expirations == 3  # counted across purges


def test_the_least_recently_used_go_past_the_entry_limit_and_are_counted():
    t = table(limit=3)
    put(t, "s", ("a", "r"), ("b", "r"), ("c", "r"))
    assert len(t) == 3 and t.stats.evictions == 0  # exactly the limit: nothing evicted
    t.exact("s", "a", now=0.0)  # a is used again
    put(t, "s", ("d", "r"))
    assert prompts(t) == ["c", "a", "d"] and t.stats.evictions == 1
    put(t, "s", ("e", "r"))
    assert t.stats.evictions == 2


def test_scopes_get_ids_never_shared_and_never_reused():
    """A scope's id keeps its rows apart in the scan: two live scopes sharing one would see each
    other's entries, and a forgotten id reused would hand a stale reader another's rows."""
    t = table()
    put(t, "alice", ("p", "r"))
    put(t, "bob", ("p", "r"))
    put(t, "carol", ("p", "r"))
    ids = [t.scope_id(s) for s in ("alice", "bob", "carol")]
    assert None not in ids and len(set(ids)) == 3
    t.remove("bob", "p")
    assert t.scope_id("bob") is None and t.scopes == 2
    put(t, "dave", ("p", "r"))
    put(t, "bob", ("p", "r"))
    assert len({t.scope_id(s) for s in ("alice", "bob", "carol", "dave")} | set(ids)) == 5


@pytest.fixture
def sizes():
    """Three entries and their sizes in bytes, each under any budget below."""
    pairs = [("first question", "a" * 40), ("second question", "b" * 60), ("third question", "c" * 80)]
    return pairs, [text_size(*p) for p in pairs]


def test_texts_that_fit_exactly_evict_nothing(sizes):
    pairs, (s1, s2, s3) = sizes
    t = table(text_limit=s1 + s2 + s3)
    put(t, "s", *pairs)
    assert len(t) == 3 and t.text_bytes == t.text_limit and t.stats.evictions == 0


def test_past_the_text_budget_just_enough_least_recently_used_go(sizes):
    pairs, (s1, s2, s3) = sizes
    t = table(text_limit=s2 + s3)  # the last two fit exactly
    put(t, "s", *pairs)
    assert prompts(t) == ["second question", "third question"] and t.stats.evictions == 1
    t = table(text_limit=s2 + s3 - 1)  # one byte short: the second must go too
    put(t, "s", *pairs)
    assert prompts(t) == ["third question"] and t.text_bytes <= t.text_limit


def test_no_text_budget_means_no_bound():
    t = table(text_limit=None)
    put(t, "s", ("p", "x" * 100_000))
    assert len(t) == 1 and t.stats.evictions == 0


def test_an_answer_exactly_the_budget_is_stored_and_one_byte_more_is_refused_and_counted():
    budget = text_size("p", "x" * 100)
    t = table(text_limit=budget)
    assert put(t, "s", ("p", "x" * 100)) == 1
    assert put(t, "s", ("p", "x" * 100)) == 1  # updated in place at exactly the budget
    assert put(t, "s", ("q", "x" * 101), ("tiny", "r")) == 1  # one refused, one stored
    assert t.stats.refusals["too-large"] == 1
    assert put(t, "s", ("q", "x" * 101)) == 0
    assert t.stats.refusals["too-large"] == 2  # counted across calls


def test_a_refused_update_drops_the_old_answer_and_the_batch_goes_on():
    t = table(text_limit=2 * text_size("p", "old") + 10)
    put(t, "s", ("p", "old"), ("q", "old"))
    assert len(t) == 2  # both stored: the update below finds each
    assert put(t, "s", ("p", "x" * 300), ("q", "new")) == 1
    assert t.stats.refusals["too-large"] == 1
    assert t.exact("s", "p", now=0.0) is None  # the old answer must not stand for the new one
    entry = t.exact("s", "q", now=0.0)
    assert entry is not None and entry.response == "new"


def test_a_tenant_keeps_at_most_its_share_and_evicts_its_own_first():
    t = table(tenant_limit=2)
    put(t, "bob/m", ("b1", "r"))
    put(t, "alice/m", ("a1", "r"), ("a2", "r"))
    put(t, "alice/other", ("a3", "r"))  # alice's oldest goes, bob's stays
    assert prompts(t) == ["b1", "a2", "a3"] and t.stats.evictions == 1
    put(t, "alice/m", ("a4", "r"))
    assert prompts(t) == ["b1", "a3", "a4"] and t.stats.evictions == 2


def test_a_tenants_last_entry_removed_forgets_the_tenant():
    t = table(tenant_limit=2)
    put(t, "alice/m", ("a1", "r"))
    assert t.remove("alice/m", "a1") and len(t) == 0
    put(t, "alice/m", ("a2", "r"), ("a3", "r"), ("a4", "r"))
    assert prompts(t) == ["a3", "a4"]


def test_after_a_restore_each_tenant_is_trimmed_to_its_share():
    t, entries = table(tenant_limit=2), []
    for scope, prompt in (
        ("alice/m", "a1"),
        ("bob/m", "b1"),
        ("alice/m", "a2"),
        ("alice/x", "a3"),
        ("carol/m", "c1"),
        ("carol/m", "c2"),
        ("carol/m", "c3"),
    ):
        entries += t.restore(scope, [(prompt, f"answer to {prompt}")], vectors(1), [float("inf")])
    t.restored(entries)
    assert prompts(t) == ["b1", "a2", "a3", "c2", "c3"] and t.stats.evictions == 2  # one each
    entry = t.exact("alice/x", "a3", now=0.0)
    assert entry is not None and (entry.scope, entry.response) == ("alice/x", "answer to a3")
    assert t.scope_id("alice/x") is not None
    loose = table()  # no share: a restore keeps everything
    loose.restored(
        [e for n in range(3) for e in loose.restore("alice/m", [(f"p{n}", "r")], vectors(1), [float("inf")])]
    )
    assert len(loose) == 3


def test_a_tenant_alone_has_the_whole_cache_under_a_fair_share():
    t = table(limit=4, fair=True)
    put(t, "alice/m", *[(f"a{n}", "r") for n in range(6)])
    assert prompts(t) == ["a2", "a3", "a4", "a5"]


def test_a_tenant_past_its_share_of_entries_evicts_its_own_and_one_within_it_anyones():
    t = table(limit=4, fair=True)
    put(t, "bob/m", ("b1", "r"), ("b2", "r"), ("b3", "r"))
    put(t, "alice/m", ("a1", "r"))
    put(t, "alice/x", ("a2", "r"))  # alice within her share (2 of 4): bob's oldest goes
    assert prompts(t) == ["b2", "b3", "a1", "a2"]
    for n in range(3, 20):  # past it: only her own go, however many she sends
        put(t, "alice/m", (f"a{n}", "r"))
    assert prompts(t) == ["b2", "b3", "a18", "a19"]
    put(t, "carol/m", ("c1", "r"))  # a third tenant: shares are now 1 of 4, carol within hers
    assert len(t) == 4 and "c1" in prompts(t)
    assert prompts(t) == ["b3", "a18", "a19", "c1"]  # the oldest of anyone's went
    put(t, "carol/m", ("c2", "r"))  # carol past her share: her own goes
    assert prompts(t) == ["b3", "a18", "a19", "c2"]
    assert t.stats.evictions == t.stats.stores - len(t)  # each one gone is counted, by either rule


@pytest.mark.parametrize("tenant_limit", [None, 4])  # a cap per tenant alone is no fair share
def test_without_a_fair_share_a_flood_evicts_everyone_else(tenant_limit):
    t = table(limit=4, tenant_limit=tenant_limit)
    put(t, "bob/m", ("b1", "r"), ("b2", "r"))
    for n in range(10):
        put(t, "alice/m", (f"a{n}", "r"))
    assert prompts(t) == ["a6", "a7", "a8", "a9"]


@pytest.mark.parametrize("tenant_limit", [None, 100])
def test_a_tenant_past_its_share_of_the_text_bytes_evicts_its_own(tenant_limit):
    small, large = text_size("b0", "r"), text_size("a0", "x" * 400)
    t = table(text_limit=4 * small + 2 * large, fair=True)
    put(t, "bob/m", *[(f"b{n}", "r") for n in range(4)])
    for n in range(25):  # large answers, past alice's half of the bytes: her own go
        put(t, "alice/m", (f"a{n}", "x" * 400))
    assert [p for p in prompts(t) if p.startswith("b")] == ["b0", "b1", "b2", "b3"]
    assert prompts(t)[-1] == "a24" and t.text_bytes <= t.text_limit
    unfair = table(text_limit=4 * small + 2 * large, tenant_limit=tenant_limit)
    put(unfair, "bob/m", *[(f"b{n}", "r") for n in range(4)])
    for n in range(25):
        put(unfair, "alice/m", (f"a{n}", "x" * 400))
    assert not [p for p in prompts(unfair) if p.startswith("b")]  # a shared LRU: bob's all gone


UNIT = text_size("a00", "r")  # every entry below is this size but the big one
BIG = ("big", "r" * (3 * UNIT - text_size("big", "")))  # three units


def test_a_tenant_over_its_share_of_the_text_bytes_gives_up_only_what_its_new_entry_needs():
    t = table(text_limit=10 * UNIT, fair=True)
    put(t, "alice/m", *[(f"a{n:02d}", "r") for n in range(10)])  # alone: the whole budget
    put(t, "bob/m", ("b00", "r"))  # bob within his share: the oldest of anyone's goes
    put(t, "alice/m", ("a10", "r"))  # alice over hers (10 of 5 units): one of her own, not five
    assert prompts(t) == [f"a{n:02d}" for n in range(2, 10)] + ["b00", "a10"]
    assert len(t) == 10 and t.text_bytes == 10 * UNIT


def test_a_tenant_gives_up_its_own_only_down_to_its_share_then_the_oldest_of_anyones_go():
    assert text_size(*BIG) == 3 * UNIT
    t = table(text_limit=10 * UNIT, fair=True)
    put(t, "bob/m", *[(f"b{n:02d}", "r") for n in range(10)])  # alone: the whole budget
    for n in range(4):  # within her share: bob's oldest go
        put(t, "alice/m", (f"a{n:02d}", "r"))
    put(t, "alice/m", BIG)  # 7 units of her 5: two of her own, then bob's oldest (he holds 6)
    assert prompts(t) == ["b05", "b06", "b07", "b08", "b09", "a02", "a03", "big"]
    assert t.text_bytes == 10 * UNIT and t.stats.evictions == t.stats.stores - len(t)


def test_what_a_tenants_own_share_gave_up_is_not_counted_again_among_anyones():
    t = table(text_limit=10 * UNIT, fair=True)
    put(t, "alice/m", *[(f"a{n:02d}", "r") for n in range(4)])  # her entries the oldest of all
    put(t, "bob/m", *[(f"b{n:02d}", "r") for n in range(6)])
    put(t, "alice/m", BIG)  # two of her own down to her share, then the oldest left: her third
    assert prompts(t) == ["a03", *[f"b{n:02d}" for n in range(6)], "big"]
    assert t.text_bytes == 10 * UNIT and t.stats.evictions == 3


def test_a_tenants_bytes_follow_its_updates_and_removals_under_a_fair_share():
    t = table(text_limit=10_000, fair=True)
    put(t, "alice/m", ("a1", "short"), ("a2", "short"))
    put(t, "alice/m", ("a1", "a much longer answer than before"))
    t.remove("alice/m", "a2")
    assert t._tenant_bytes == {"alice": text_size("a1", "a much longer answer than before")}
    t.remove("alice/m", "a1")
    assert t._tenant_bytes == {} and t._tenants == {}


def test_a_row_with_no_entry_is_a_bug_that_names_the_row():
    with pytest.raises(RuntimeError, match="index row 99 has no entry"):
        table().at_row(99)


def test_the_entries_are_nothing_the_garbage_collector_walks(fake_embedder):
    """Held as plain tuples of strings and numbers, the entries are untracked after a
    collection, so a full collection (the GIL held, every request waiting) does not grow with
    them; objects of a class would be tracked for as long as they live."""
    import gc

    from gpucache import SemanticCache

    cache = SemanticCache(fake_embedder, device="cpu")
    cache.warm([(f"question number {i}", f"answer {i}") for i in range(50)])
    cache.put("question number 3", "a newer answer")  # replaced: another tuple
    gc.collect()
    held = list(cache._core.table._entries.values()) + list(cache._core.table._by_row.values())
    assert len(held) == 100 and not any(gc.is_tracked(stored) for stored in held)
    assert cache.get("question number 3").response == "a newer answer"


@pytest.mark.parametrize("meanwhile", ["dropped", "replaced"])
def test_the_lock_free_read_serves_nothing_changed_between_its_two_looks(monkeypatch, meanwhile):
    """``peek`` runs without the lock, beside a store or a removal under it. The race is made
    here deterministic: the entry is dropped, or stored again with another answer, while the read
    is between its first look at the mapping and its second (as it reads the row's expiry). The
    read then serves nothing; only a read that saw the same record twice serves it."""
    t = table()
    put(t, "s", ("a question", "the old answer"))
    assert t.peek("s", "a question", now=0.0).response == "the old answer"
    real = t.index.expires_at

    def racing(row):
        if meanwhile == "dropped":
            t.drop([e for e in t if e.prompt == "a question"])
        else:
            put(t, "s", ("a question", "the new answer"))
        monkeypatch.setattr(t.index, "expires_at", real)
        return real(row)

    monkeypatch.setattr(t.index, "expires_at", racing)
    assert t.peek("s", "a question", now=0.0) is None
    served = t.peek("s", "a question", now=0.0)
    assert served is None if meanwhile == "dropped" else served.response == "the new answer"
