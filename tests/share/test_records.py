"""The shared record format (gpucache/share/records.py), without a Redis: what a replica writes
reads back as the same entry, and a crafted record is refused with a reason, never applied."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpucache.share.records import (
    Keys,
    Signer,
    as_bytes,
    decode_entries,
    entry_fields,
    id_after,
    model_mismatch,
)

SECRET = b"a secret of at least sixteen bytes"


def as_read(fields):
    """A hash as redis-py returns it: bytes names and values."""
    return {k.encode(): as_bytes(v) for k, v in fields.items()}


UNSIGNED = Signer(None)


def record(signer=UNSIGNED, *, model="m", dim=4, vector=None, **overrides):
    vector = np.arange(dim, dtype="<f4") / 10 if vector is None else vector
    fields = entry_fields(
        "tenant",
        "What is my PIN?",
        "1234",
        1e12,
        model,
        dim,
        vector.astype("<f4").tobytes(),
        "origin",
        "5.0",
        1,
    )
    fields.update(overrides)
    return as_read(signer.signed(fields))


def test_a_written_record_reads_back_as_the_same_entry():
    entries, refusals = decode_entries([record()], "m", 4, Signer(None))
    assert refusals == []
    [entry] = entries
    assert (entry.scope, entry.prompt, entry.response, entry.expires_at) == (
        "tenant",
        "What is my PIN?",
        "1234",
        1e12,
    )
    assert entry.vector.tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert entry.written_at == 5.0


def test_a_lone_surrogate_survives_the_round_trip():
    fields = entry_fields("s", "p", "\ud800 odd", 1e12, "m", 4, bytes(16), "origin", "5.0", 1)
    entries, _ = decode_entries([as_read(fields)], "m", 4, Signer(None))
    assert entries[0].response == "\ud800 odd"


@pytest.mark.parametrize(
    "crafted, kind",
    [
        (dict(model="other"), "refused"),
        (dict(dim=8, vector=np.zeros(8)), "refused"),
        (dict(vector=np.zeros(3)), "malformed"),  # three floats where the record says four
        (dict(vector=np.array([math.inf, 0, 0, 0])), "malformed"),  # would outscore any threshold
        (dict(expires_at="soon"), "malformed"),
    ],
)
def test_a_crafted_record_is_refused_with_its_kind_and_the_others_still_apply(crafted, kind):
    if "vector" in crafted and "dim" not in crafted:
        bad = record()
        bad[b"vector"] = crafted["vector"].astype("<f4").tobytes()
    elif "expires_at" in crafted:
        bad = record()
        bad[b"expires_at"] = b"soon"
    else:
        bad = record(**crafted)
    entries, refusals = decode_entries([bad, record(prompt=b"Another prompt")], "m", 4, Signer(None))
    assert [r.kind for r in refusals] == [kind]
    assert [e.prompt for e in entries] == ["Another prompt"]


def test_text_that_is_not_utf8_is_malformed():
    bad = record()
    bad[b"response"] = b"\xff\xfe"
    bad[b"prompt"] = b"\xc3"
    entries, refusals = decode_entries([bad], "m", 4, Signer(None))
    assert entries == [] and refusals[0].kind == "malformed"


def test_with_a_secret_only_records_signed_with_it_are_read():
    signer = Signer(SECRET)
    assert decode_entries([record(signer)], "m", 4, signer)[1] == []
    unsigned = record()
    forged = record(Signer(b"another secret, sixteen bytes+"))
    tampered = record(signer)
    tampered[b"response"] = b"a planted answer"  # signed fields changed after signing
    entries, refusals = decode_entries([unsigned, forged, tampered], "m", 4, signer)
    assert entries == [] and [r.kind for r in refusals] == ["unsigned"] * 3


def test_signatures_tell_apart_fields_whose_concatenations_match():
    signer = Signer(SECRET)
    assert signer.mac({b"a": b"bc"}) != signer.mac({b"ab": b"c"})


def test_the_key_layout_keeps_scopes_apart():
    keys = Keys("p")
    assert keys.record("a", "x") != keys.record("b", "x")
    assert keys.record("a", "x").startswith("p:e:") and keys.claim("a", "x").startswith("p:claim:")


def test_stream_ids_compare_as_pairs_of_numbers():
    assert id_after("10-0", "9-5") and id_after("5-10", "5-9")
    assert not id_after("5-9", "5-10") and not id_after("5-1", "5-1")


def test_another_model_in_the_meta_is_named():
    assert model_mismatch({b"model": b"m", b"dim": b"4"}, "m", 4) is None
    assert model_mismatch({}, "m", 4) is None  # nothing written yet
    assert model_mismatch({b"model": b"other", b"dim": b"8"}, "m", 4) == ("other", 8)
