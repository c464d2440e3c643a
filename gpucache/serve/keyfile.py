"""``auth = keys``: an operator's file of the keys allowed, stored hashed, read again when it
changes.

Why a module of its own: the settings check the file when they are resolved (a typo fails at
start, not at the first request), and the settings import nothing outside the standard library
(docs/architecture.md, "Tiers"); the verdict a request gets from the list, an OpenAI-shaped
401, is auth.py's (``keys_verdict``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("gpucache.serve")


class KeyFileError(ValueError):
    """The key file cannot be read at start: the message says why."""


def key_digest(key: str) -> str:
    """How a key is kept: its SHA-256, hex. A key file may list keys this way
    (``sha256:<hex>``), so the file itself need not hold a usable key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def parse_key_file(text: str) -> frozenset[str]:
    """The digests of the keys a file allows: one per line, either the key itself or
    ``sha256:<64 hex digits>``; blank lines and ``#`` comments ignored. A line that looks like
    a digest but is malformed is refused rather than taken as a key nobody holds."""
    digests = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.lower().startswith("sha256:"):
            digest = line[7:].strip().lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise KeyFileError(f"line {number}: a sha256: line needs 64 hex digits")
            digests.add(digest)
        else:
            digests.add(key_digest(line))
    return frozenset(digests)


def bare(value: str) -> str:
    """A credential's key: an Authorization value without its scheme (RFC 9110 §11.1: the
    scheme is case-insensitive), any other value as sent."""
    scheme, _, rest = value.partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest else value


class KeyFile:
    """``auth = keys``: the keys an operator allows, from ``path``; checked on every request
    (a set lookup of the key's digest: no upstream call), the file read again when its
    modification time or size changes, looked at at most every ``recheck`` seconds and read off
    the event loop. A file that becomes unreadable or malformed keeps the last good list (and
    says so in the log): a typo in an edit must not lock every client out or let every key in.
    A request is allowed when it carries at least one credential and every credential it
    carries is listed: one listed key cannot vouch for another beside it."""

    def __init__(self, path: str, recheck: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.recheck, self.clock = path, recheck, clock
        try:
            self.seen, self.digests = self._read()
        except (OSError, KeyFileError) as exc:
            raise KeyFileError(f"the key file {path} cannot be read: {exc}") from exc
        self.looked = clock()
        self.looking: asyncio.Task[None] | None = None
        self.reloads = 0  # times the file was read again (tests and logs)

    def _read(self) -> tuple[tuple[int, int], frozenset[str]]:
        info = os.stat(self.path)
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        digests = parse_key_file(text)
        if info.st_mode & 0o077 and any(
            not line.strip().lower().startswith(("sha256:", "#")) and line.strip()
            for line in text.splitlines()
        ):
            log.warning(
                "gpucache: the key file %s holds keys as written and others than its owner may "
                "read it: list them as sha256:<hex> (gpucache.serve.keyfile.key_digest), or "
                "chmod 600 it",
                self.path,
            )
        return (info.st_mtime_ns, info.st_size), digests

    def _reload_if_changed(self) -> None:
        try:
            info = os.stat(self.path)
            if (info.st_mtime_ns, info.st_size) == self.seen:
                return
            self.seen, self.digests = self._read()
            self.reloads += 1
        except (OSError, KeyFileError, UnicodeDecodeError) as exc:
            log.error(
                "gpucache: the key file %s could not be read again (%s); the last list read stands",
                self.path,
                exc,
            )

    async def fresh(self) -> None:
        """The list as the file now says, looked at most every ``recheck`` seconds."""
        if self.looking is None and self.clock() - self.looked >= self.recheck:
            self.looked = self.clock()
            self.looking = asyncio.ensure_future(asyncio.to_thread(self._reload_if_changed))
        if self.looking is not None:
            looking = self.looking
            try:
                await asyncio.shield(looking)
            finally:
                if self.looking is looking and looking.done():
                    self.looking = None

    def allows(self, values: tuple[str, ...]) -> bool:
        """Whether a request carrying ``values`` (its credentials' values, as sent) is let in:
        at least one, and every one listed (as the list stood when last looked at)."""
        return bool(values) and all(key_digest(bare(v)) in self.digests for v in values)
