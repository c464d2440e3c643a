"""What replicas write to Redis and read back: the key layout, the signature, and entries decoded
from records, each record checked as a crafted one would be.

    {prefix}:meta        hash   model and dimension
    {prefix}:e:{key}     hash   one entry (``entry_fields``)
    {prefix}:claim:{key} string a replica-wide claim on a miss being loaded
    {prefix}:log         stream put / del / clear / join events

Every event and record names its writer (``origin``), its place in that writer's sequence
(``seq``) and when it was signed (``at``); with a secret the signature covers all three, which
is what lets a replica refuse a genuine record or event put back (replay.py).

Reading a record never raises for what the record holds: ``decode_entries`` returns the entries
it could read and a ``Refusal`` for each it could not (another model, a bad field, a missing or
wrong signature, a replay), which the share counts and logs. A record is data from anyone who can write to
Redis, so nothing in it is trusted before it is checked: a vector of the wrong length or not
finite (an inf would score above any threshold), text that is not UTF-8, an expiry that is not a
number.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gpucache.cache.replication import SharedEntry
from gpucache.keys import prompt_key
from gpucache.share.replay import Version


class SharedModelMismatch(ValueError):
    """The shared log was written by replicas of another model or dimension."""


@dataclass(frozen=True)
class Keys:
    """The key layout under one prefix; replicas of one cache share the prefix."""

    prefix: str

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def claim(self, scope: str, prompt: str) -> str:
        return self.key(f"claim:{prompt_key(scope, prompt).hex()}")

    def record(self, scope: str, prompt: str) -> str:
        return self.key(f"e:{prompt_key(scope, prompt).hex()}")


@dataclass(frozen=True)
class Signer:
    """Signs every record and event written, and checks those read back, with a secret shared
    by every replica; with none, everything is unsigned and every read passes."""

    secret: bytes | None

    def signed(self, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` with their signature added, where there is a secret."""
        if self.secret is None:
            return fields
        return {**fields, "mac": self.mac({k.encode(): as_bytes(v) for k, v in fields.items()})}

    def mac(self, fields: dict[bytes, bytes]) -> str:
        """An HMAC over every field but the signature, sorted and length-prefixed: no two
        mappings sign alike, whatever their values hold."""
        if self.secret is None:
            raise RuntimeError("gpucache bug: a signature asked of an unsigned share")
        mac = hmac.new(self.secret, digestmod=hashlib.sha256)
        for name in sorted(fields):
            if name == b"mac":
                continue
            for part in (name, fields[name]):
                mac.update(len(part).to_bytes(8, "big"))
                mac.update(part)
        return mac.hexdigest()

    def verified(self, fields: dict[Any, Any]) -> bool:
        """Whether fields read back carry this signer's signature (always, with no secret)."""
        if self.secret is None:
            return True
        given = fields.get(b"mac")
        return isinstance(given, bytes) and hmac.compare_digest(given, self.mac(fields).encode())


@dataclass(frozen=True)
class Refusal:
    """A record not applied: ``kind`` is "unsigned", "refused" (another model), "malformed",
    "replayed" (genuine, but older than what this replica has applied: replay.py) or
    "superseded" (a put's record already replaced by a newer one, whose own event brings it:
    passed over, not counted); ``which`` names it for the log (the start of its prompt),
    ``reason`` says what was wrong."""

    kind: str
    which: Any
    reason: str


def entry_fields(
    scope: str,
    prompt: str,
    response: str,
    expires_at: float,
    model: str,
    dim: int,
    vector: bytes,
    origin: str,
    at: str,
    seq: int,
) -> dict[str, Any]:
    """A record's fields, as written (``decode_entries`` reads them back); ``origin``, ``seq``
    and ``at`` are those of the put event that announces it: the record's version."""
    return {
        "scope": utf8(scope),
        "prompt": utf8(prompt),
        "response": utf8(response),
        "expires_at": repr(expires_at),
        "model": model,
        "dim": str(dim),
        "vector": vector,
        "origin": origin,
        "at": at,
        "seq": str(seq),
    }


def version_of(fields: dict[Any, Any], *, record: bool) -> Version:
    """The writer, sequence and signing time that fields read back name. A record written
    before records carried a sequence reads as sequence 0 (older than anything a tombstone
    remembers of its writer); an event without one raises ``ValueError``: it cannot be told
    from a replay."""
    origin = fields.get(b"origin", b"").decode()
    seq = fields.get(b"seq")
    if seq is None and not record:
        raise ValueError("an event without a sequence")
    number = 0 if seq is None else int(seq)
    if number < (0 if record else 1):
        raise ValueError(f"sequence {number}")
    at = float(fields.get(b"at", b"nan"))
    if not math.isfinite(at):
        raise ValueError(f"signed at {at!r}")
    return Version(origin, number, at)


Judge = Callable[[dict[Any, Any]], "Refusal | None"]


def decode_entries(
    records: list[dict[Any, Any]], model: str, dim: int, signer: Signer, judge: Judge | None = None
) -> tuple[list[SharedEntry], list[Refusal]]:
    """Records as entries of ``model`` and ``dim``, and a refusal for each one that is not: one
    bad record must not stop the others, in the tail or in a bootstrap. ``judge``: asked of
    each record whose signature holds, before it is decoded (replays: replay.py)."""
    entries: list[SharedEntry] = []
    refusals: list[Refusal] = []
    for record in records:
        outcome = _decode(record, model, dim, signer, judge)
        if isinstance(outcome, SharedEntry):
            entries.append(outcome)
        else:
            refusals.append(outcome)
    return entries, refusals


def _decode(
    record: dict[Any, Any], model: str, dim: int, signer: Signer, judge: Judge | None
) -> SharedEntry | Refusal:
    which = record.get(b"prompt", b"?")[:40]
    if not signer.verified(record):
        return Refusal("unsigned", which, "no valid signature")
    if judge is not None:
        verdict = judge(record)
        if verdict is not None:
            return verdict
    try:
        their_model, their_dim = record.get(b"model", b"").decode(), int(record.get(b"dim", b"0"))
    except (ValueError, UnicodeDecodeError) as exc:
        return Refusal("malformed", which, repr(exc))
    if (their_model, their_dim) != (model, dim):
        return Refusal(
            "refused", which, f"model {their_model!r} (dim {their_dim}): this replica runs {model!r}"
        )
    try:
        vector_bytes = record[b"vector"]
        if len(vector_bytes) != 4 * dim:
            raise ValueError(f"a vector of {len(vector_bytes)} bytes for dimension {dim}")
        values = np.frombuffer(vector_bytes, dtype="<f4")
        if not np.isfinite(values).all():  # an inf would score above any threshold
            raise ValueError("a vector that is not finite")
        return SharedEntry(
            text(record[b"scope"]),
            text(record[b"prompt"]),
            text(record[b"response"]),
            float(record[b"expires_at"]),
            torch.from_numpy(values.copy()),
            float(record.get(b"at", b"nan")),
        )
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        return Refusal("malformed", which, repr(exc))


def model_mismatch(meta: dict[Any, Any], model: str, dim: int) -> tuple[str, int] | None:
    """The model and dimension the shared log's meta names, where they are not ``model`` and
    ``dim``; None where they are (or where the meta names none yet)."""
    theirs = meta.get(b"model", model.encode()).decode(), int(meta.get(b"dim", str(dim).encode()))
    return None if theirs == (model, dim) else theirs


def utf8(value: str) -> bytes:
    """A text as Redis stores it: UTF-8, a lone surrogate (legal in a Python str, valid in
    JSON, refused by a strict encoder) kept rather than failing the write."""
    return value.encode("utf-8", "surrogatepass")


def text(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def as_bytes(value: Any) -> bytes:
    """A field value as Redis will hold it (what redis-py sends for a str, bytes or number)."""
    return value if isinstance(value, bytes) else str(value).encode()


def id_after(a: str, b: str) -> bool:
    """Whether stream id ``a`` comes after ``b``."""
    ams, aseq = (int(x) for x in a.split("-"))
    bms, bseq = (int(x) for x in b.split("-"))
    return (ams, aseq) > (bms, bseq)
