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
    cache = SemanticCache(fake_embedder, device="cpu", verifier=ThresholdOnly(), threshold=0.8,
                          admission=AdmissionPolicy(min_sightings=2), ttl=3600)
    cache.warm([("alpha beta", "1"), ("gamma delta", "2")])
    cache.warm([("alpha beta", "tenant 1")], scope="tenant")
    cache.get_or_put("seen once", lambda p: "not admitted")
    cache.get("alpha beta!")
    return cache


def test_save_then_load_answers_every_lookup_as_before(filled, tmp_path, device):
    path = tmp_path / "cache.gpucache"
    filled.save(path)
    loaded = SemanticCache.load(path, embedder=filled.embedder, device=device,
                                verifier=ThresholdOnly())
    for prompt, scope in [("alpha beta", None), ("Alpha beta?", None), ("gamma delta", None),
                          ("alpha beta", "tenant"), ("gamma delta", "tenant"), ("zzz", None)]:
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


def test_another_version_or_format_is_refused(filled, tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "c"
    save_file({"vectors": torch.zeros(0, 64)}, str(path),
              metadata={"format": "gpucache-snapshot", "version": "99"})
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
