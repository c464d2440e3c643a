"""Snapshots: save a cache to one file and load it back, with no pickle anywhere.

Format: one safetensors file. Its tensors are ``vectors`` (N, D) float32, the live entries'
embeddings in least-recently-used-first order, and ``state`` (B,) uint8, the UTF-8 bytes of a
JSON document holding everything else: format version, model name and dimension, settings,
entries (scope, prompt, response, expiry), counters and the admission sketch. The safetensors
header's metadata carries the format name, the version and a blake2b checksum of both tensors,
so a truncated or altered file is refused with a clear ``SnapshotError`` instead of loading half
a cache. A checksum proves nothing about who wrote the file: where a ``key`` is given, the header
also carries an HMAC of the checksum under it, and a file without the right one is refused, so a
snapshot planted by someone without the key (answers filed under any tenant) never loads.
safetensors parses only a JSON header and raw arrays: loading an untrusted file can
not run code, which ``pickle`` and ``torch.load`` can.

Atomic: the bytes go to a temporary file in the destination folder, are fsynced, and replace
the destination with ``os.replace`` (then the folder is fsynced). A process killed mid-save
leaves the previous snapshot intact; readers see the old file or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpucache.cache.settings import CacheSettings
from gpucache.policy.admission import AdmissionPolicy

FORMAT = "gpucache-snapshot"
VERSION = 1


class SnapshotError(ValueError):
    """A snapshot that cannot be loaded: corrupt, truncated, another version, another model."""


@dataclass(frozen=True)
class SnapshotEntry:
    scope: str
    prompt: str
    response: str
    expires_at: float  # seconds on the cache's clock; inf = never


@dataclass
class Snapshot:
    model: str
    dim: int
    settings: dict[str, Any]
    entries: list[SnapshotEntry]
    vectors: torch.Tensor  # (N, D) float32 on the CPU
    stats: dict[str, Any]
    admission: dict[str, Any] | None


def _checksum(vectors: bytes, state: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(len(vectors).to_bytes(8, "little"))
    digest.update(vectors)
    digest.update(state)
    return digest.hexdigest()


def _encode_float(x: float) -> float | str:
    return "inf" if x == float("inf") else x


def _mac(key: bytes, checksum: str) -> str:
    return hmac.new(key, f"{FORMAT}/{VERSION}/{checksum}".encode(), hashlib.sha256).hexdigest()


def write_snapshot(snapshot: Snapshot, path: str | os.PathLike[str], key: bytes | None = None) -> None:
    """Write ``snapshot`` to ``path`` atomically (temp file, fsync, rename); signed with
    ``key`` where one is given."""
    from safetensors.torch import save

    doc = {
        "format": FORMAT,
        "version": VERSION,
        "model": snapshot.model,
        "dim": snapshot.dim,
        "settings": snapshot.settings,
        "entries": [
            [e.scope, e.prompt, e.response, _encode_float(e.expires_at)] for e in snapshot.entries
        ],
        "stats": snapshot.stats,
        "admission": snapshot.admission,
    }
    state = json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
    vectors = snapshot.vectors.detach().to("cpu", torch.float32).contiguous()
    if vectors.shape != (len(snapshot.entries), snapshot.dim):
        raise RuntimeError("gpucache bug: snapshot vectors do not match its entries")
    state_tensor = torch.frombuffer(bytearray(state), dtype=torch.uint8) if state else torch.empty(
        0, dtype=torch.uint8
    )
    metadata = {
        "format": FORMAT,
        "version": str(VERSION),
        "checksum": _checksum(vectors.numpy().tobytes(), state),
    }
    if key is not None:
        metadata["mac"] = _mac(key, metadata["checksum"])
    data = save({"vectors": vectors, "state": state_tensor}, metadata=metadata)
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def read_snapshot(path: str | os.PathLike[str], key: bytes | None = None) -> Snapshot:
    """Read and check a snapshot; any defect raises ``SnapshotError`` naming it. ``key``: the
    file must carry its HMAC under this key (``write_snapshot``'s), or it is refused."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise SnapshotError(f"no snapshot at {path}") from exc
    metadata = _header_metadata(data, path)
    if metadata.get("format") != FORMAT:
        raise SnapshotError(f"{path} is not a gpucache snapshot (format {metadata.get('format')!r})")
    if metadata.get("version") != str(VERSION):
        raise SnapshotError(
            f"{path} is snapshot version {metadata.get('version')}, this gpucache reads {VERSION}"
        )
    try:
        tensors = load(data)
    except SafetensorError as exc:
        raise SnapshotError(f"{path} is corrupt: {exc}") from exc
    vectors, state_tensor = tensors.get("vectors"), tensors.get("state")
    if vectors is None or state_tensor is None:
        raise SnapshotError(f"{path} is corrupt: missing tensors")
    state = state_tensor.numpy().tobytes()
    if metadata.get("checksum") != _checksum(vectors.numpy().tobytes(), state):
        raise SnapshotError(f"{path} is corrupt: checksum mismatch")
    if key is not None and not hmac.compare_digest(metadata.get("mac", ""), _mac(key, metadata["checksum"])):
        raise SnapshotError(f"{path} is not signed with this key: refused")
    try:
        doc = json.loads(state.decode("utf-8", "surrogatepass"))
        entries = [
            SnapshotEntry(str(s), str(p), str(r), float(e)) for s, p, r, e in doc["entries"]
        ]
        snapshot = Snapshot(
            model=str(doc["model"]),
            dim=int(doc["dim"]),
            settings=dict(doc["settings"]),
            entries=entries,
            vectors=vectors,
            stats=dict(doc["stats"]),
            admission=doc.get("admission"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"{path} is corrupt: bad state document ({exc})") from exc
    if vectors.dtype != torch.float32 or vectors.shape != (len(entries), snapshot.dim):
        raise SnapshotError(
            f"{path} is corrupt: vectors {tuple(vectors.shape)} for {len(entries)} entries of "
            f"dimension {snapshot.dim}"
        )
    return snapshot


def _header_metadata(data: bytes, path: object) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors header: 8-byte little-endian length, then JSON."""
    if len(data) < 8:
        raise SnapshotError(f"{path} is corrupt: truncated ({len(data)} bytes)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise SnapshotError(f"{path} is corrupt: truncated header")
    try:
        header = json.loads(data[8 : 8 + size])
    except ValueError as exc:
        raise SnapshotError(f"{path} is corrupt: unreadable header") from exc
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise SnapshotError(f"{path} is not a gpucache snapshot (no metadata)")
    return {str(k): str(v) for k, v in meta.items()}


def check_model(snapshot: Snapshot, model: str, dim: int | None, path: str | os.PathLike[str]) -> None:
    """Refuse a snapshot written with another model (or, ``dim`` given, another dimension)
    than the embedder that is to read it: its vectors would mean nothing to that model."""
    if dim is None and snapshot.model != model:
        raise SnapshotError(f"{path} was written with model {snapshot.model!r}: pass embedder= that model")
    if dim is not None and snapshot.dim != dim:
        raise SnapshotError(f"{path} holds {snapshot.dim}-dimensional vectors, the embedder makes {dim}")
    if snapshot.model != model:
        raise SnapshotError(f"{path} was written with model {snapshot.model!r}, the embedder is {model!r}")


def saved_policies(
    snapshot: Snapshot, path: str | os.PathLike[str]
) -> tuple[CacheSettings, AdmissionPolicy | None]:
    """The settings and the admission sketch a snapshot holds, each checked as it is decoded
    (a crafted file gets a ``SnapshotError``, never a cache with settings out of range)."""
    try:
        settings = CacheSettings.from_json(snapshot.settings)
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"{path} is corrupt: bad settings ({exc})") from exc
    if snapshot.admission is None:
        return settings, None
    try:
        return settings, AdmissionPolicy.from_state(snapshot.admission)
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"{path} is corrupt: bad admission sketch ({exc})") from exc
