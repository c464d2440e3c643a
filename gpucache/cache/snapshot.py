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

Generations: a signature says who wrote a file, not that it is the latest, so a signed snapshot
copied aside and put back later would load its invalidated answers again. With a ``key``, each
file is a generation (1, 2, ...) and the HMAC binds it with the time it was written; a small
signed record beside the snapshot, ``{path}.generation``, holds the highest generation written
or loaded at that path. A file of a lower generation than that record is refused
(``SnapshotError``: an older snapshot put back). A higher one loads and moves the record up to
it: that is what a save leaves when the process dies between renaming the snapshot and
renaming the record, and only a holder of the key can sign a generation. The integer decides;
the time is bound and reported, never compared. Limits, stated: whoever can write the folder
can put back an older snapshot *and* its older record together, or delete the record (the
next file loads as the first of its path); only storage the writer of these files cannot
rewrite would stop that. A record not signed with the key is refused like the snapshot would
be. A signed file from before generations reads as generation 0: it loads only where no record
exists yet. Without a key there is no generation and nothing to check.

Atomic: the bytes go to a temporary file in the destination folder, are fsynced, and replace
the destination with ``os.replace`` (then the folder is fsynced). A process killed mid-save
leaves the previous snapshot intact; readers see the old file or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpucache.cache.settings import CacheSettings
from gpucache.policy.admission import AdmissionPolicy

log = logging.getLogger("gpucache.snapshot")

FORMAT = "gpucache-snapshot"
VERSION = 1
GENERATION_SUFFIX = ".generation"  # the record of the highest generation at a path


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
    generation: int = 0  # read back from a signed file; 0: unsigned, from before, or captured
    written_at: float | None = None  # wall-clock time a signed file was written


def _checksum(vectors: bytes, state: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(len(vectors).to_bytes(8, "little"))
    digest.update(vectors)
    digest.update(state)
    return digest.hexdigest()


def _encode_float(x: float) -> float | str:
    return "inf" if x == float("inf") else x


def _mac(key: bytes, checksum: str, generation: int | None = None, written_at: str = "") -> str:
    """The file's HMAC: of its checksum, its generation and the time it was written (a file
    from before generations: of its checksum alone)."""
    signed = f"{FORMAT}/{VERSION}/{checksum}"
    if generation is not None:
        signed += f"/{generation}/{written_at}"
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class _Latest:
    """The record beside a snapshot: the highest generation written or loaded at its path."""

    generation: int
    written_at: str

    def _mac(self, key: bytes) -> str:
        signed = f"{FORMAT}-generation/{self.generation}/{self.written_at}"
        return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def path(snapshot_path: str | os.PathLike[str]) -> Path:
        return Path(f"{os.fspath(snapshot_path)}{GENERATION_SUFFIX}")

    @classmethod
    def read(cls, snapshot_path: str | os.PathLike[str], key: bytes) -> _Latest | None:
        """The record, None where there is none; ``SnapshotError`` for one that cannot be read
        or is not signed with ``key``."""
        where = cls.path(snapshot_path)
        try:
            doc = json.loads(where.read_bytes())
            latest = cls(int(doc["generation"]), str(doc["written_at"]))
            given = str(doc["mac"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise SnapshotError(
                f"{where} (the record of {snapshot_path}'s generations) cannot be read ({exc}): refused"
            ) from exc
        if latest.generation < 1 or not hmac.compare_digest(given, latest._mac(key)):
            raise SnapshotError(
                f"{where} (the record of {snapshot_path}'s generations) is not signed with this key: refused"
            )
        return latest

    def write(self, snapshot_path: str | os.PathLike[str], key: bytes) -> None:
        doc = {"generation": self.generation, "written_at": self.written_at, "mac": self._mac(key)}
        _write_atomically(self.path(snapshot_path), json.dumps(doc).encode())


def write_snapshot(snapshot: Snapshot, path: str | os.PathLike[str], key: bytes | None = None) -> int:
    """Write ``snapshot`` to ``path`` atomically (temp file, fsync, rename); signed with
    ``key`` where one is given, as the next generation at ``path`` (after the record's and
    after the snapshot's own), which it returns (0 without a key). The record beside it is
    written after the snapshot, so a crash between the two leaves a newer file, never an older
    one, than the record says."""
    from safetensors.torch import save

    doc = {
        "format": FORMAT,
        "version": VERSION,
        "model": snapshot.model,
        "dim": snapshot.dim,
        "settings": snapshot.settings,
        "entries": [[e.scope, e.prompt, e.response, _encode_float(e.expires_at)] for e in snapshot.entries],
        "stats": snapshot.stats,
        "admission": snapshot.admission,
    }
    state = json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
    vectors = snapshot.vectors.detach().to("cpu", torch.float32).contiguous()
    if vectors.shape != (len(snapshot.entries), snapshot.dim):
        raise RuntimeError("gpucache bug: snapshot vectors do not match its entries")
    state_tensor = (
        torch.frombuffer(bytearray(state), dtype=torch.uint8) if state else torch.empty(0, dtype=torch.uint8)
    )
    metadata = {
        "format": FORMAT,
        "version": str(VERSION),
        "checksum": _checksum(vectors.numpy().tobytes(), state),
    }
    generation = 0
    if key is not None:
        try:
            latest = _Latest.read(path, key)
        except SnapshotError as exc:  # overwritten below, with this key's own
            log.warning("gpucache: %s; writing a new one", exc)
            latest = None
        generation = max(latest.generation if latest is not None else 0, snapshot.generation) + 1
        metadata["generation"], metadata["written_at"] = str(generation), repr(time.time())
        metadata["mac"] = _mac(key, metadata["checksum"], generation, metadata["written_at"])
    data = save({"vectors": vectors, "state": state_tensor}, metadata=metadata)
    _write_atomically(Path(path), data)
    if key is not None:
        _Latest(generation, metadata["written_at"]).write(path, key)
    return generation


def _write_atomically(target: Path, data: bytes) -> None:
    """``data`` to ``target``: a temporary file in its folder, fsynced, renamed over it, and
    the folder fsynced."""
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
    file must carry its HMAC under this key (``write_snapshot``'s), or it is refused, and be of
    no older a generation than the record beside it (see the module's docstring)."""
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
    generation, written_at = 0, None
    if key is not None:
        generation, written_at = _check_signed(metadata, path, key)
    try:
        doc = json.loads(state.decode("utf-8", "surrogatepass"))
        entries = [SnapshotEntry(str(s), str(p), str(r), float(e)) for s, p, r, e in doc["entries"]]
        snapshot = Snapshot(
            model=str(doc["model"]),
            dim=int(doc["dim"]),
            settings=dict(doc["settings"]),
            entries=entries,
            vectors=vectors,
            stats=dict(doc["stats"]),
            admission=doc.get("admission"),
            generation=generation,
            written_at=written_at,
        )
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # nested past the parser's depth
        raise SnapshotError(f"{path} is corrupt: bad state document ({exc})") from exc
    if vectors.dtype != torch.float32 or vectors.shape != (len(entries), snapshot.dim):
        raise SnapshotError(
            f"{path} is corrupt: vectors {tuple(vectors.shape)} for {len(entries)} entries of "
            f"dimension {snapshot.dim}"
        )
    return snapshot


def _check_signed(
    metadata: dict[str, str], path: str | os.PathLike[str], key: bytes
) -> tuple[int, float | None]:
    """A file's signature, and its generation against the record beside it: the generation
    and the time it was written, or ``SnapshotError``. A newer generation than the record's
    moves the record up to it (best effort: a folder that cannot be written only logs)."""
    try:
        generation = int(metadata["generation"]) if "generation" in metadata else None
    except ValueError as exc:
        raise SnapshotError(f"{path} is corrupt: generation {metadata['generation']!r}") from exc
    written = metadata.get("written_at", "")
    expected = _mac(key, metadata["checksum"], generation, written)
    if not hmac.compare_digest(metadata.get("mac", ""), expected):
        raise SnapshotError(f"{path} is not signed with this key: refused")
    try:
        written_at: float | None = float(written) if generation is not None else None
    except ValueError as exc:  # signed, so written so: a gpucache bug
        raise SnapshotError(f"{path} is corrupt: written at {written!r}") from exc
    generation = generation or 0  # signed before generations: the oldest there can be
    latest = _Latest.read(path, key)
    if latest is not None and generation < latest.generation:
        when = f"written at {_when(written_at)}" if written_at is not None else "from before generations"
        raise SnapshotError(
            f"{path} is generation {generation} ({when}), older than generation "
            f"{latest.generation} (written at {_when(float(latest.written_at))}), the last written "
            "or loaded there: refused (an older snapshot put back?)"
        )
    if generation >= 1 and (latest is None or generation > latest.generation):
        try:
            _Latest(generation, written).write(path, key)
        except OSError as exc:
            log.warning("gpucache: could not record %s's generation %d (%r)", path, generation, exc)
    return generation, written_at


def _when(at: float) -> str:
    if not math.isfinite(at):
        return repr(at)
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _header_metadata(data: bytes, path: object) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors header: 8-byte little-endian length, then JSON."""
    if len(data) < 8:
        raise SnapshotError(f"{path} is corrupt: truncated ({len(data)} bytes)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise SnapshotError(f"{path} is corrupt: truncated header")
    try:
        header = json.loads(data[8 : 8 + size])
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser's depth
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
