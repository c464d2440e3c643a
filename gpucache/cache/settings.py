"""``CacheSettings``: every scalar setting of a cache, in one frozen dataclass.

Why one object: the constructor, ``save``/``load``, ``gpucache info`` and the README's options
table all read these fields, so a setting is added in one place and cannot be dropped by one
of them (a snapshot used to replay a hand-kept dict of settings, and silently lost any setting
not added there). Each field carries its own documentation and whether a snapshot keeps it;
``scan_kernel`` is a speed choice of the machine at hand, so a snapshot leaves it out.

Collaborators (embedder, verifier, policies, device, timer) are not settings: they are objects
the caller builds, passed to ``SemanticCache`` beside these.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpucache.cache.validation import check_positive_int, check_threshold, check_ttl
from gpucache.fields import setting
from gpucache.index.interface import DEFAULT_SCAN_BUDGET_BYTES, SCAN_KERNELS, check_quantization

# With the lexical verifier, the threshold at which qqp served about 6% of its different-question
# pairs; chosen on all of qqp, both halves, so the README says its report half is not wholly out
# of sample. A deployment fits its own with `gpucache calibrate` on its own labelled pairs.
DEFAULT_THRESHOLD = 0.875
# One candidate. Chosen when, with an earlier verifier, a second candidate added more wrong
# answers than hits in the intent replay; with today's verifier the replay in
# bench/reports/semantic-false-hits.md serves a few more with top_k 2 or 4 and no more wrong ones.
# The default was not changed on that figure: a report is not tuning data.
DEFAULT_TOP_K = 1
DEFAULT_CAPACITY = 100_000


def _setting(default: Any, doc: str, *, shown: str | None = None, saved: bool = True) -> Any:
    return setting(default, doc, shown=shown, saved=saved)


@dataclass(frozen=True)
class CacheSettings:
    """The scalar settings of a ``SemanticCache``; each has a default and is checked here."""

    threshold: float = _setting(
        DEFAULT_THRESHOLD,
        "lowest cosine similarity a semantic candidate may have, in (0, 1] (see the evidence above)",
    )
    top_k: int = _setting(DEFAULT_TOP_K, "candidates above the threshold offered to the verifier, best first")
    capacity: int = _setting(
        DEFAULT_CAPACITY, "most entries kept; a full cache evicts the least recently used"
    )
    max_text_bytes: int | None = _setting(
        2**30,
        "most memory the entries' prompts and responses may hold (their string sizes); past "
        "it the least recently used are evicted, and an entry larger than all of it is not stored "
        "(`None`: entries alone bound it)",
        shown="`1 GiB`",
    )
    tenant_capacity: int | None = _setting(
        None,
        "most entries one tenant keeps (a scope's part before its first `/`, as a server's "
        "scopes begin with the tenant); past it that tenant's least recently used go, no one "
        "else's. `None`: one LRU for all, which keeps what is used most whoever asked it",
    )
    fair_share: bool = _setting(
        False,
        "where room is needed, a tenant holding more than its share of the capacity or the "
        "text bytes (divided among the tenants holding entries) evicts its own least recently "
        "used, not others'; a tenant alone has the whole cache. On in `gpucache serve`, where each "
        "key is a tenant",
    )
    ttl: float | None = _setting(
        None, "default seconds an entry lives (`None`: until evicted); `put(..., ttl=)` overrides"
    )
    replay_chunk_chars: int = _setting(64, "characters per chunk when a hit is replayed as a stream")
    quantization: str | None = _setting(
        "auto",
        'device storage: `"auto"` (`"int8"` on a CPU without `max_device_bytes`, else `"fp32"`), '
        '`None`/`"fp32"`, `"fp16"`, `"bf16"`, `"int8"` (quantized modes rescored in fp32); '
        "`cache.quantization` says which is in use; a quantized CPU store measures whether batches "
        "scan its quantized rows or its fp32 copy (`cache.scan_paths`)",
    )
    max_device_bytes: int | None = _setting(
        None, "most device memory the store may take; the cache evicts to stay within it"
    )
    scan_budget_bytes: int = _setting(
        DEFAULT_SCAN_BUDGET_BYTES,
        "most scratch memory one chunk of the similarity scan may take",
        shown="`64 MiB`",
    )
    lookup_window_seconds: float = _setting(
        0.0,
        "above `0`, concurrent async lookups coalesce: one that arrives while no batch is "
        "computing is sent at once, alone; those that arrive while one computes share the next "
        "batch (one embedder call, one scan per scope), sent the moment the running one returns. "
        "No lookup waits for this many seconds: the value is a switch (kept a number for the "
        "configs that set it). `0`: each lookup its own batch, at once. Not kept in snapshots",
        saved=False,
    )
    lookup_batch: int = _setting(
        64,
        "most async lookups one coalesced batch holds: a full batch is sent at once. Not kept in snapshots",
        saved=False,
    )
    lookup_timeout_seconds: float | None = _setting(
        None,
        "an async lookup taking longer raises `LookupTimeout` (a server then goes upstream); "
        "`None`: no limit. Not kept in snapshots",
        saved=False,
    )
    match_context: bool = _setting(
        False,
        "`false`: a conversation is served by meaning only after the same earlier turns, word for "
        "word. `true`: `ContextMatcher` also sets aside an opening greeting, and nothing else. "
        "Off by default: with one key shared by many "
        "users, the matcher of the round before, which read the turns by meaning, served one "
        "customer's answer after another's record, account or approval (issue 65); it goes back on "
        "by the rule docs/conversations.md states. Not kept in snapshots",
        saved=False,
    )
    scan_kernel: str = _setting(
        "auto",
        '`"auto"`: on CUDA with Triton installed, the store times the fused Triton kernel and '
        "matmul + topk on its own scans (per query bucket 1 / up to 64 / more, again each time "
        "the store grows 4x, from 65,536 rows) and keeps the faster, measuring in a thread of its "
        'own while lookups scan with torch; elsewhere `"torch"`. '
        'Or `"torch"`, `"triton"`. Not kept in snapshots: it is a speed choice of this machine',
        saved=False,
    )

    def __post_init__(self) -> None:
        if not isinstance(self.match_context, bool):
            raise TypeError(f"match_context must be true or false, got {self.match_context!r}")
        check_threshold(self.threshold)
        check_positive_int(self.top_k, "top_k")
        check_positive_int(self.capacity, "capacity")
        check_ttl(self.ttl)
        if self.max_text_bytes is not None:
            check_positive_int(self.max_text_bytes, "max_text_bytes")
        if self.tenant_capacity is not None:
            check_positive_int(self.tenant_capacity, "tenant_capacity")
        check_positive_int(self.replay_chunk_chars, "replay_chunk_chars")
        check_quantization(self.quantization)
        if self.max_device_bytes is not None:
            check_positive_int(self.max_device_bytes, "max_device_bytes")
        check_positive_int(self.scan_budget_bytes, "scan_budget_bytes")
        if (
            isinstance(self.lookup_window_seconds, bool)
            or not isinstance(self.lookup_window_seconds, (int, float))
            or not 0 <= self.lookup_window_seconds <= 1
        ):
            raise ValueError(f"lookup_window_seconds must be in [0, 1], got {self.lookup_window_seconds!r}")
        check_positive_int(self.lookup_batch, "lookup_batch")
        if self.lookup_timeout_seconds is not None:
            check_ttl(self.lookup_timeout_seconds, "lookup_timeout_seconds")
        if self.scan_kernel not in SCAN_KERNELS:
            raise ValueError(f"scan_kernel must be one of {SCAN_KERNELS}, got {self.scan_kernel!r}")
        # numbers given as ints are kept as floats, so a saved snapshot reads back equal
        object.__setattr__(self, "threshold", float(self.threshold))
        if self.ttl is not None:
            object.__setattr__(self, "ttl", float(self.ttl))

    @classmethod
    def from_options(cls, base: CacheSettings | None = None, **options: Any) -> CacheSettings:
        """``base`` (or the defaults) with ``options`` replaced; an unknown name is a TypeError
        that lists the known ones."""
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise TypeError(
                f"unknown cache setting(s) {', '.join(map(repr, unknown))}; "
                f"settings are: {', '.join(cls.names())}"
            )
        return dataclasses.replace(base or cls(), **options)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_json(self) -> dict[str, Any]:
        """The settings a snapshot keeps (all but the machine's speed choices)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["saved"]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CacheSettings:
        """Settings read back from ``to_json``; names this version does not know are refused
        (a snapshot from a newer gpucache), missing ones take their defaults (an older one)."""
        saved = {f.name for f in dataclasses.fields(cls) if f.metadata["saved"]}
        unknown = sorted(set(doc) - saved)
        if unknown:
            raise ValueError(f"unknown saved setting(s): {', '.join(unknown)}")
        return cls(**doc)

    def items(self) -> Iterator[tuple[str, Any]]:
        for f in dataclasses.fields(self):
            yield f.name, getattr(self, f.name)

    @classmethod
    def markdown_rows(cls) -> list[str]:
        """The README's options-table rows for these settings: name, default, meaning."""
        rows = []
        for f in dataclasses.fields(cls):
            shown = f.metadata["shown"] or _markdown_value(f.default)
            rows.append(f"| `{f.name}` | {shown} | {f.metadata['doc']} |")
        return rows


def _markdown_value(value: object) -> str:
    if value is None:
        return "`None`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A TOML settings file as a dict; ``ValueError`` says why one cannot be read (the one
    reader of settings files, for ``read_settings_file`` and ``gpucache serve --config``)."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10: tomli, a core dependency there (pyproject.toml)
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"the settings file cannot be read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"the settings file {path} is not valid TOML: {exc}") from exc


def read_settings_file(path: str | os.PathLike[str]) -> tuple[CacheSettings, Any, str | None]:
    """The ``[cache]`` and ``[guard]`` tables of a TOML settings file (``gpucache calibrate``
    writes them; ``gpucache serve --config`` reads the same file, with its server settings),
    as ``CacheSettings`` and ``GuardSettings``, and its ``[embedder]`` model (None: not named).
    Other tables and keys are a server's and are left alone; an unknown key inside the first
    two is refused by name."""
    from gpucache.guard.settings import GuardSettings

    doc = read_toml(path)
    cache, guard = doc.get("cache", {}), doc.get("guard", {})
    if not isinstance(cache, dict) or not isinstance(guard, dict):
        raise ValueError(f"{path}: [cache] and [guard] must be tables")
    unknown = sorted(set(guard) - {"skip_rules", "decision"})
    if unknown:
        raise ValueError(
            f"{path}: unknown [guard] setting(s) {unknown}; the settings are skip_rules, decision"
        )
    model = (doc.get("embedder") or {}).get("model") if isinstance(doc.get("embedder"), dict) else None
    if model is not None and not isinstance(model, str):
        raise ValueError(f"{path}: [embedder] model must be a string")
    return (
        CacheSettings.from_options(**cache),
        GuardSettings(tuple(guard.get("skip_rules", ())), guard.get("decision", "rules")),
        model,
    )
