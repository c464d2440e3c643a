"""Snapshots: save and load without pickle, atomically, refusing anything corrupt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import FakeEmbedder

from gpucache import AdmissionPolicy, SemanticCache, SnapshotError, ThresholdOnly


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def filled(fake_embedder):
    cache = SemanticCache(
        fake_embedder,
        device="cpu",
        verifier=ThresholdOnly(),
        threshold=0.8,
        admission=AdmissionPolicy(min_sightings=2),
        ttl=3600,
    )
    cache.warm([("alpha beta", "1"), ("gamma delta", "2")])
    cache.warm([("alpha beta", "tenant 1")], scope="tenant")
    cache.get_or_put("seen once", lambda p: "not admitted")
    cache.get("alpha beta!")
    return cache


def test_save_then_load_answers_every_lookup_as_before(filled, tmp_path, device):
    path = tmp_path / "cache.gpucache"
    filled.save(path)
    loaded = SemanticCache.load(path, embedder=filled.embedder, device=device, verifier=ThresholdOnly())
    for prompt, scope in [
        ("alpha beta", None),
        ("Alpha beta?", None),
        ("gamma delta", None),
        ("alpha beta", "tenant"),
        ("gamma delta", "tenant"),
        ("zzz", None),
    ]:
        assert loaded.get(prompt, scope=scope) == filled.get(prompt, scope=scope)
    assert len(loaded) == len(filled) == 3
    assert (loaded.threshold, loaded.ttl, loaded.capacity) == (0.8, 3600.0, filled.capacity)
    assert loaded.admission.estimate("default", "seen once") == 1
    assert loaded.stats().admissions_deferred == 1
    assert str(loaded.device) == str(device)


def test_expired_entries_are_dropped_at_load(fake_embedder, tmp_path):
    clock = Clock()
    cache = SemanticCache(fake_embedder, device="cpu", timer=clock)
    cache.put("short lived", "a", ttl=10)
    cache.put("long lived", "b", ttl=1000)
    cache.save(tmp_path / "c")
    clock.now += 100
    loaded = SemanticCache.load(tmp_path / "c", embedder=fake_embedder, device="cpu", timer=clock)
    assert len(loaded) == 1 and loaded.get("long lived").response == "b"
    assert loaded.get("short lived") is None


def test_lru_order_survives_a_round_trip(fake_embedder, tmp_path):
    cache = SemanticCache(fake_embedder, device="cpu", capacity=3)
    cache.warm([("one", "1"), ("two", "2"), ("three", "3")])
    cache.get("one")
    cache.save(tmp_path / "c")
    loaded = SemanticCache.load(tmp_path / "c", embedder=fake_embedder, device="cpu")
    loaded.put("four", "4")  # evicts "two", the least recently used
    assert loaded.get("two") is None and loaded.get("one") is not None


def test_the_snapshot_holds_no_pickle(filled, tmp_path):
    path = tmp_path / "c"
    filled.save(path)
    data = path.read_bytes()
    assert b"\x80\x04" not in data[:64] and data[8:9] == b"{"  # a safetensors JSON header
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) == {"vectors", "state"}
        assert f.metadata()["format"] == "gpucache-snapshot"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[: len(b) // 2], "corrupt"),
        (lambda b: b[:5], "truncated"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),
        (lambda b: b"not a snapshot at all" * 10, "corrupt"),
        (lambda b: b"", "truncated"),
    ],
)
def test_a_damaged_file_is_refused_with_a_clear_error(filled, tmp_path, damage, message):
    path = tmp_path / "c"
    filled.save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SnapshotError, match=message):
        SemanticCache.load(path, embedder=filled.embedder, device="cpu")


def test_a_header_nested_past_the_parsers_depth_is_a_snapshot_error(fake_embedder, tmp_path):
    """json gives up on deep nesting with RecursionError, not ValueError: a crafted file must
    still be refused as corrupt (a server sets it aside) rather than raise something else."""
    import struct

    path = tmp_path / "c"
    nested = b"[" * 200_000 + b"]" * 200_000
    path.write_bytes(struct.pack("<Q", len(nested)) + nested)
    with pytest.raises(SnapshotError, match="unreadable header"):
        SemanticCache.load(path, embedder=fake_embedder, device="cpu")


def test_another_version_or_format_is_refused(filled, tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "c"
    save_file(
        {"vectors": torch.zeros(0, 64)}, str(path), metadata={"format": "gpucache-snapshot", "version": "99"}
    )
    with pytest.raises(SnapshotError, match="version 99"):
        SemanticCache.load(path, embedder=filled.embedder, device="cpu")
    save_file({"x": torch.zeros(1)}, str(path), metadata={"format": "something-else"})
    with pytest.raises(SnapshotError, match="not a gpucache snapshot"):
        SemanticCache.load(path, embedder=filled.embedder, device="cpu")


def test_another_model_or_dimension_is_refused(filled, tmp_path):
    path = tmp_path / "c"
    filled.save(path)
    with pytest.raises(SnapshotError, match="dimensional"):
        SemanticCache.load(path, embedder=FakeEmbedder(dim=32), device="cpu")
    other = FakeEmbedder()
    other.name = "another-model"
    with pytest.raises(SnapshotError, match="written with model"):
        SemanticCache.load(path, embedder=other, device="cpu")
    with pytest.raises(SnapshotError, match="pass embedder="):
        SemanticCache.load(path, device="cpu")  # the default model is not the one it was saved with


def test_a_missing_file_is_a_snapshot_error(tmp_path, fake_embedder):
    with pytest.raises(SnapshotError, match="no snapshot"):
        SemanticCache.load(tmp_path / "nothing", embedder=fake_embedder)


def test_a_real_model_snapshot_round_trips(real_embedder, tmp_path):
    cache = SemanticCache(real_embedder, device="cpu")
    cache.put("How do I reset my password?", "Settings > Security.")
    cache.save(tmp_path / "c")
    loaded = SemanticCache.load(tmp_path / "c", embedder=real_embedder, device="cpu")
    assert loaded.get("How can I reset my password?").response == "Settings > Security."


@pytest.mark.slow
def test_a_process_killed_mid_save_leaves_the_previous_snapshot_intact(tmp_path):
    path = tmp_path / "cache.gpucache"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        from conftest import FakeEmbedder
        from gpucache import SemanticCache, StoreEverything
        cache = SemanticCache(FakeEmbedder(), device="cpu", cache_policy=StoreEverything())
        cache.warm([(f"prompt {{i}}", "x" * 2000) for i in range(3000)])
        cache.save({str(path)!r})
        print("first", flush=True)
        n = 0
        while True:  # save again and again until killed
            n += 1
            cache.put(f"extra {{n}}", "y")
            cache.save({str(path)!r})
            print("saved", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "first"
        for _ in range(3):  # three more saves done: the next is in flight when the kill comes
            assert proc.stdout.readline().strip() == "saved"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    loaded = SemanticCache.load(path, embedder=FakeEmbedder(), device="cpu")
    assert len(loaded) >= 3000
    assert loaded.get("prompt 1234").response == "x" * 2000


def test_a_signed_snapshot_loads_only_with_its_key(fake_embedder, tmp_path):
    """With a key, save signs the file and load refuses any file not signed with that key:
    an unsigned one, one signed with another key, one whose contents changed."""
    cache = SemanticCache(fake_embedder, device="cpu")
    cache.put("signed prompt", "signed answer")
    signed, unsigned = tmp_path / "signed.gpucache", tmp_path / "unsigned.gpucache"
    cache.save(signed, key=b"the-right-key")
    cache.save(unsigned)
    loaded = SemanticCache.load(signed, embedder=fake_embedder, device="cpu", key=b"the-right-key")
    assert loaded.get("signed prompt").response == "signed answer"
    for path, key in ((unsigned, b"the-right-key"), (signed, b"another-key")):
        with pytest.raises(SnapshotError, match="not signed"):
            SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=key)
    # without a key the signature is not asked for: a library user's own files load as before
    assert len(SemanticCache.load(unsigned, embedder=fake_embedder, device="cpu")) == 1


# --------------------------------------------------------------------- generations

KEY = b"the-servers-snapshot-key"


def _saved(cache, path):
    cache.save(path, key=KEY)
    return path.read_bytes()


def test_an_older_signed_snapshot_put_back_is_refused(fake_embedder, tmp_path):
    """Each signed save is the next generation at its path; the file of an earlier one, signed
    with the same key and whole, is refused once a later one was written there."""
    path = tmp_path / "cache.gpucache"
    cache = SemanticCache(fake_embedder, device="cpu")
    cache.put("What is the door code?", "4321")
    first = _saved(cache, path)
    cache.invalidate("What is the door code?")
    cache.put("What are the opening hours?", "9 to 5")
    second = _saved(cache, path)
    path.write_bytes(first)  # the older file put back
    with pytest.raises(SnapshotError, match=r"generation 1 \(written at .*older than generation 2"):
        SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)
    path.write_bytes(second)
    loaded = SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)
    assert loaded.get("What is the door code?") is None and len(loaded) == 1
    loaded.save(path, key=KEY)  # generation 3
    path.write_bytes(second)
    with pytest.raises(SnapshotError, match="older than generation 3"):
        SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)


def _metadata(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata()


def _resigned(path, **metadata):
    """The file's tensors again under ``metadata`` changed: what an editor of the header does."""
    from safetensors.torch import load, save

    path.write_bytes(save(load(path.read_bytes()), metadata={**_metadata(path), **metadata}))


def test_the_generation_and_the_time_are_signed(fake_embedder, tmp_path):
    """A put-back file whose header claims a later generation, or another time, is not the
    file that was signed."""
    from gpucache.cache.snapshot import read_snapshot

    path = tmp_path / "c"
    cache = SemanticCache(fake_embedder, device="cpu")
    cache.put("a prompt", "an answer")
    first = _saved(cache, path)
    _saved(cache, path)
    read = read_snapshot(path, KEY)
    assert (read.generation, _metadata(path)["generation"]) == (2, "2")
    assert read.written_at == float(_metadata(path)["written_at"])
    for change in ({"generation": "3"}, {"written_at": repr(read.written_at + 1)}):
        path.write_bytes(first)
        _resigned(path, **change)
        with pytest.raises(SnapshotError, match="not signed with this key"):
            read_snapshot(path, KEY)


def test_a_newer_generation_than_the_record_loads_and_moves_the_record(fake_embedder, tmp_path):
    """What a save leaves when the process dies between renaming the snapshot and renaming
    its record: a newer file than the record says. It loads, and the record follows it."""
    path, record = tmp_path / "c", tmp_path / "c.generation"
    cache = SemanticCache(fake_embedder, device="cpu")
    cache.put("a prompt", "an answer")
    first = _saved(cache, path)
    first_record = record.read_bytes()
    second = _saved(cache, path)
    record.write_bytes(first_record)  # as if the second save had died before its record
    assert len(SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)) == 1
    path.write_bytes(first)
    with pytest.raises(SnapshotError, match="older than generation 2"):
        SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)
    path.write_bytes(second)
    record.unlink()  # no record (a first save, or one lost): any signed generation loads
    assert len(SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)) == 1


def test_a_record_of_generations_not_signed_with_the_key_is_refused_and_replaced(fake_embedder, tmp_path):
    import json

    path, record = tmp_path / "c", tmp_path / "c.generation"
    cache = SemanticCache(fake_embedder, device="cpu")
    cache.put("a prompt", "an answer")
    _saved(cache, path)
    forged = {**json.loads(record.read_bytes()), "generation": 1_000_000}  # would refuse all
    for bad in (json.dumps(forged).encode(), b"not json"):
        record.write_bytes(bad)
        with pytest.raises(SnapshotError, match="record of .* generations"):
            SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)
    _saved(cache, path)  # a save writes a record of its own
    assert SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY).get("a prompt")


def test_a_signed_file_from_before_generations_loads_only_where_no_record_exists(fake_embedder, tmp_path):
    """Signed as gpucache signed before generations (its checksum alone): generation 0, the
    oldest there is. It loads where nothing newer was written, and nowhere else."""
    import hashlib
    import hmac

    from gpucache.cache.snapshot import FORMAT, VERSION

    path = tmp_path / "c"
    cache = SemanticCache(fake_embedder, device="cpu")
    cache.put("an old prompt", "an old answer")
    cache.save(path)
    checksum = _metadata(path)["checksum"]
    _resigned(path, mac=hmac.new(KEY, f"{FORMAT}/{VERSION}/{checksum}".encode(), hashlib.sha256).hexdigest())
    old = path.read_bytes()
    loaded = SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)
    assert loaded.get("an old prompt").response == "an old answer"
    assert not (tmp_path / "c.generation").exists()  # generation 0 records nothing
    loaded.save(path, key=KEY)
    path.write_bytes(old)
    with pytest.raises(SnapshotError, match=r"generation 0 \(from before generations\)"):
        SemanticCache.load(path, embedder=fake_embedder, device="cpu", key=KEY)


def test_without_a_key_there_is_no_generation_to_check(fake_embedder, tmp_path):
    """Unsigned, a file proves nothing about who wrote it, so nothing about when: an older one
    loads (the key is what a server sets: ``gpucache serve`` always signs)."""
    path = tmp_path / "c"
    cache = SemanticCache(fake_embedder, device="cpu")
    cache.put("a prompt", "first")
    cache.save(path)
    first = path.read_bytes()
    cache.put("a prompt", "second")
    cache.save(path)
    path.write_bytes(first)
    assert SemanticCache.load(path, embedder=fake_embedder, device="cpu").get("a prompt").response == "first"
    assert not (tmp_path / "c.generation").exists()


def _with_bad_counters(cache: SemanticCache, path, key: bytes | None = None) -> None:
    """``cache`` saved with valid entries and counters that do not read: checksum-valid and,
    with ``key``, signed, so every check of the file passes and only the restore can refuse."""
    from dataclasses import replace

    from gpucache.cache.snapshot import read_snapshot, write_snapshot

    cache.save(path)
    write_snapshot(replace(read_snapshot(path), stats={"misses": "many"}), path, key)


def test_a_snapshot_whose_counters_do_not_read_restores_nothing(filled, fake_embedder, tmp_path):
    from gpucache.cache.snapshot import read_snapshot

    path = tmp_path / "c.gpucache"
    _with_bad_counters(filled, path, key=b"k" * 32)
    with pytest.raises(SnapshotError, match="counters do not read"):
        SemanticCache.load(path, fake_embedder, device="cpu", key=b"k" * 32)
    # into a cache that holds entries of its own: refused, and the cache holds what it held
    target = SemanticCache(fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.8)
    target.put("kept before", "mine")
    before = target.stats()
    with pytest.raises(SnapshotError, match="counters do not read"):
        target.restore(read_snapshot(path, key=b"k" * 32))
    assert len(target) == 1 and target.get("kept before").response == "mine"
    assert target.get("alpha beta") is None and target.get("gamma delta") is None
    assert target.stats().stores == before.stores


def test_an_entry_the_cache_holds_is_kept_over_the_snapshots(filled, fake_embedder, tmp_path):
    from gpucache.cache.snapshot import read_snapshot

    path = tmp_path / "c.gpucache"
    filled.save(path)
    target = SemanticCache(fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.8)
    target.put("alpha beta", "stored since")
    target.restore(read_snapshot(path))
    assert target.get("alpha beta").response == "stored since"
    assert target.get("gamma delta").response == "2"
    assert len(target) == len(filled)


class Recording:
    """A replication that records when it is attached, and what the cache held then."""

    def __init__(self) -> None:
        from gpucache.cache.replication import LocalOnly

        self.inner = LocalOnly()
        self.held_at_attach: list[int] = []
        self.closed = 0

    def attach(self, replica) -> None:
        self.held_at_attach.append(len(replica.core.table))
        self.inner.attach(replica)

    def close(self) -> None:
        self.closed += 1

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_replication_is_attached_after_the_entries_are_in_and_never_to_a_failed_load(
    filled, fake_embedder, tmp_path
):
    good, bad = tmp_path / "good.gpucache", tmp_path / "bad.gpucache"
    filled.save(good)
    _with_bad_counters(filled, bad)
    failed = Recording()
    with pytest.raises(SnapshotError):
        SemanticCache.load(bad, fake_embedder, device="cpu", shared=failed)
    assert failed.held_at_attach == []  # no thread of the share's was started for a cache that failed
    shared = Recording()
    cache = SemanticCache.load(good, fake_embedder, device="cpu", shared=shared)
    assert shared.held_at_attach == [len(filled)] and cache.shared is shared


def test_a_restore_that_fails_midway_leaves_none_of_the_snapshot_served(
    filled, fake_embedder, tmp_path, monkeypatch
):
    """The snapshot's scopes go in one by one; where one fails (memory, a device error), those
    already in are taken out again: all or nothing, never an entry half restored and served."""
    from gpucache.cache.snapshot import read_snapshot

    path = tmp_path / "c.gpucache"
    filled.save(path)
    target = SemanticCache(fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.8)
    target.put("kept before", "mine")
    table = target._core.table
    calls: list[str] = []
    real = table.restore

    def failing_second(scope, *args, **kwargs):
        calls.append(scope)
        if len(calls) == 2:
            raise MemoryError("the device is full")
        return real(scope, *args, **kwargs)

    monkeypatch.setattr(table, "restore", failing_second)
    with pytest.raises(MemoryError):
        target.restore(read_snapshot(path))
    assert len(calls) == 2  # one scope was in before the failure
    assert target.get("alpha beta") is None and target.get("gamma delta") is None
    assert target.get("alpha beta", scope="tenant") is None
    assert len(target) == 1 and target.get("kept before").response == "mine"
