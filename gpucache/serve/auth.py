"""Whether a credential may be served from the cache: the upstream's word on it, asked once and
kept for a bounded time.

Why: a hit never reaches the upstream that would have checked the key, so without this a key
the upstream refuses, or has revoked, is still served every answer filed under it, and can probe
its tenant's history by meaning for as long as the entries live. The proxy has no keys of its
own, so it asks the upstream: ``GET /v1/models`` with the request's own credentials (headers and
query string, as the request would forward them). A 2xx allows the credential; a 401 or 403
refuses it, and the client gets the upstream's own answer and nothing from the cache; either
verdict is kept ``ttl`` seconds, then asked again, so a revocation takes effect within ``ttl``.
Concurrent requests with one new credential make one check. Where the upstream cannot answer
(unreachable, 5xx), a verdict seen before is kept (its answers were the upstream's word), and a
credential never seen is refused with the upstream's failure: the cache serves no one it could
not check.

A request without credentials (where the deployment lets them in, ``require_auth=False``) is
checked the same way, with no credentials: an upstream that wants a key refuses it, and the
keyless tenant's entries go to no one.

Modes (``ServeSettings.auth``): ``upstream`` (``CredentialCheck``), ``keys`` (``keys_verdict``
over keyfile.py's ``KeyFile``: an operator's file of allowed keys, stored hashed, read again
when it changes), ``gateway`` (a
trusted front has authenticated every client, and strips what it has not), ``none`` (no check:
only where the upstream checks nothing either).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpucache.cache.replication import ClearedPrefixes
from gpucache.serve import wire
from gpucache.serve.keyfile import KeyFile
from gpucache.serve.upstream import Upstream, UpstreamUnavailable

log = logging.getLogger("gpucache.serve")

# How long a request with a key seen before waits on the key's re-check before it is served on
# the key's last verdict (``CredentialCheck.check``): an upstream that answers checks at all
# answers within it; a hung one would otherwise hold the key's hits for the check's timeout
STALE_WAIT = 0.25
MAX_VERDICTS = 100_000  # credentials remembered at once; the oldest are asked again past it
PROBE_PREFIX = "gpucache-probe-"  # a probe's key: this prefix and 32 random hex digits
NOT_AN_AUTHORITY = (
    "auth=upstream, but the upstream answered GET /v1/models with a 2xx to a key it cannot have issued "
    "(a random one): it checks no keys there (llama.cpp's server, for one, lists /v1/models among its "
    "public endpoints), so its word on a key is no check, and every key, revoked or made up, would be "
    "served the cache. Use --auth keys with a key file of the keys the upstream accepts (or --auth "
    "gateway behind a front that authenticates, or --auth none where the upstream checks nothing)"
)


@dataclass(frozen=True)
class Allowed:
    """The upstream accepts the credential."""


@dataclass(frozen=True)
class Denied:
    """The upstream refuses the credential: its own answer, relayed to the client."""

    status: int
    headers: Any
    content: bytes


@dataclass(frozen=True)
class Unverified:
    """The upstream could not say, and the credential was never seen: refused with the
    upstream's failure (502 unreachable, 504 too slow, 503 an error answer)."""

    status: int
    message: str


Verdict = Allowed | Denied | Unverified


@dataclass(frozen=True)
class Kept:
    """A verdict kept: until when it stands, and when the upstream last gave it (an
    extension while the upstream cannot answer never reaches past ``confirmed`` + ttl + grace)."""

    verdict: Allowed | Denied
    until: float
    confirmed: float
    cleared: int = 0  # the credential's clears (ClearedPrefixes) before it was asked: a later one ends it


class CredentialCheck:
    """The verdicts of ``upstream`` on credentials, each kept ``ttl`` seconds.

    A check waits at most ``timeout`` seconds (its own, not the completions' long one), so a
    hung ``/v1/models`` holds a key's requests, hits included, that long and no longer. Where
    the upstream cannot answer (unreachable, too slow, an error status), a key's last verdict is
    extended by ``ttl`` at a time, for at most ``grace`` seconds past its own expiry; a
    credential never seen, or seen longer ago than that, is refused with the upstream's failure.
    """

    def __init__(
        self,
        upstream: Upstream,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        max_verdicts: int = MAX_VERDICTS,
        timeout: float = 5.0,
        grace: float = 300.0,
        max_checks: int = 64,
        cleared: ClearedPrefixes | None = None,
    ) -> None:
        self.upstream, self.ttl, self.clock, self.max_verdicts = upstream, ttl, clock, max_verdicts
        # the cache's clears under a credential (a revoke, here or on another replica): a verdict
        # kept from before one is asked again
        self.cleared = cleared or ClearedPrefixes()
        self.timeout, self.grace, self.max_checks = timeout, grace, max_checks
        self.verdicts: dict[str, Kept] = {}
        # checks the upstream could not answer, each remembered for ``timeout`` seconds: a burst of
        # requests with a key it cannot vouch for costs one check, not one each
        self.unanswered: dict[str, tuple[Unverified, float]] = {}
        self.asking: dict[str, asyncio.Future[Verdict]] = {}
        self.asked = 0  # checks sent to the upstream (tests and metrics)
        # whether the upstream refuses a key it never issued: True, its word is a check; False,
        # it is not (NOT_AN_AUTHORITY; probed again once a ttl, and every key refused until a
        # probe is refused); None, not known yet (it could not answer the probe)
        self.authority: bool | None = None
        self.authority_until = 0.0  # when a True is probed again (at most once a ttl)
        self.probing: asyncio.Future[bool | None] | None = None
        self.confirming: asyncio.Future[bool | None] | None = None  # ``confirm``'s probe

    async def probe(self) -> bool | None:
        """Ask ``/v1/models`` with a key that cannot be valid, once until the upstream answers:
        a 401 or 403 makes it the authority on keys, a 2xx proves it checks none there. At start
        (``create_app`` refuses to serve with an upstream that is no authority) and, where the
        upstream could not answer then, before the first verdict (``confirm`` asks again)."""
        if self.authority is not None:
            return self.authority
        if self.probing is not None:
            return await asyncio.shield(self.probing)
        probing = self.probing = asyncio.get_running_loop().create_future()
        try:
            self._heard(await self._probe_once())
            return self.authority
        finally:
            self.probing = None
            if not probing.done():
                probing.set_result(self.authority)

    async def confirm(self) -> None:
        """The probe again, once ``ttl`` has passed since the upstream last answered it, before
        a verdict: an upstream replaced, or reconfigured, by one that checks no keys would
        otherwise allow every key, revoked or not, from then on. It runs in a task of its own,
        and a request waits on it as briefly as on a known key's re-check (``STALE_WAIT``): a
        hung ``/v1/models`` holds no one for the probe's timeout, and one that cannot answer
        leaves the upstream's standing as it was."""
        if self.confirming is None or self.confirming.done():
            self.authority_until = self.clock() + self.ttl  # asked at most once a ttl, answered or not
            self.confirming = asyncio.ensure_future(self._probe_once())
            self.confirming.add_done_callback(self._confirmed)
        await asyncio.wait((self.confirming,), timeout=min(STALE_WAIT, self.timeout))

    async def _probe_once(self) -> bool | None:
        """The upstream's word on a key it cannot have issued: True refused, False accepted,
        None where it could not answer."""
        key = PROBE_PREFIX + secrets.token_hex(16)
        try:
            response = await self.upstream.send(
                "GET", "models", {"authorization": f"Bearer {key}"}, b"", timeout=self.timeout
            )
        except UpstreamUnavailable:
            return None  # asked again before the next verdict
        if response.status_code in (401, 403):
            return True
        return False if 200 <= response.status_code < 300 else None

    def _confirmed(self, task: asyncio.Future[bool | None]) -> None:
        if not task.cancelled():
            self._heard(task.result())

    def _heard(self, authority: bool | None) -> None:
        if authority is True:
            if self.authority is False:
                log.warning("gpucache: the upstream refuses a key it never issued again: keys are served")
            self.authority, self.authority_until = True, self.clock() + self.ttl
        elif authority is False:
            if self.authority is not False:
                log.error("gpucache: %s", NOT_AN_AUTHORITY)
            # probed again once a ttl: a maintenance page or a misrouted deploy that answered
            # the probe is not the upstream for ever (until then every key is refused)
            self.authority, self.authority_until = False, self.clock() + self.ttl

    def forget(self, credential: str) -> None:
        """Drop a credential's verdict: its next request is checked again."""
        self.verdicts.pop(credential, None)

    async def check(self, credential: str, headers: Mapping[str, str], query: str) -> Verdict:
        if self.authority is None:
            await self.probe()
        if self.authority is False and self.clock() >= self.authority_until:
            await self.confirm()  # lost a ttl ago: has the upstream come back as the authority?
        if self.authority is False:
            return Unverified(503, NOT_AN_AUTHORITY)
        kept = self.verdicts.get(credential)
        if kept is not None and self.cleared.since(credential) > kept.cleared:
            del self.verdicts[credential]  # revoked since, here or on another replica: asked again,
            kept = None  # and never extended while the upstream cannot answer
        if kept is not None and kept.until > self.clock():
            return kept.verdict
        if self.authority and self.clock() >= self.authority_until:  # a verdict is needed: is
            await self.confirm()  # the upstream still the authority on keys?
            if self.authority is False:
                return Unverified(503, NOT_AN_AUTHORITY)
        pending = self.asking.get(credential)
        if pending is None:
            failed = self.unanswered.get(credential)
            if failed is not None and failed[1] > self.clock():
                return failed[0]
            if len(self.asking) >= self.max_checks:  # a flood of new keys: each would be a request upstream
                return Unverified(
                    503, f"more than {self.max_checks} credentials are being checked at once: retry shortly"
                )
            pending = self._asking(credential, headers, query, kept)
        if kept is not None and self.clock() < kept.confirmed + self.ttl + self.grace:
            # a key seen before waits on its re-check briefly: an upstream that answers at once
            # decides this request, a slow or hung one does not hold it (hits included) for the
            # check's whole timeout; it is served on its last word, within the grace that would
            # extend it anyway, and the check, left running, decides the requests after it
            done, _ = await asyncio.wait((pending,), timeout=min(STALE_WAIT, self.timeout))
            if not done:
                return kept.verdict
        return await asyncio.shield(pending)

    def _asking(
        self, credential: str, headers: Mapping[str, str], query: str, kept: Kept | None
    ) -> asyncio.Future[Verdict]:
        """The upstream asked about ``credential``, in a task of its own: concurrent requests
        with it wait on the one check (``asking``), and one that stops waiting leaves it running."""

        async def ask() -> Verdict:
            try:
                return await self._ask(credential, headers, query, kept)
            finally:
                del self.asking[credential]

        task = self.asking[credential] = asyncio.ensure_future(ask())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
        return task

    async def _ask(
        self, credential: str, headers: Mapping[str, str], query: str, before: Kept | None
    ) -> Verdict:
        self.asked += 1
        cleared = self.cleared.number  # before the answer: a revoke while it is awaited ends it
        try:
            response = await self.upstream.send(
                "GET", "models", headers, b"", params=query, timeout=self.timeout
            )
        except UpstreamUnavailable as down:
            return self._unanswered(credential, before, down.status, str(down))
        if 200 <= response.status_code < 300:
            return self.keep(credential, Allowed(), cleared)
        if response.status_code in (401, 403):
            denied = Denied(response.status_code, response.headers, response.content)
            return self.keep(credential, denied, cleared)
        return self._unanswered(credential, before, 503, f"the upstream answered {response.status_code}")

    def keep(
        self, credential: str, verdict: Allowed | Denied, cleared: int | None = None
    ) -> Allowed | Denied:
        """``verdict`` kept for ``credential``: a check's answer. (The upstream's refusal on a
        request it was sent, a miss or a refresh, drops the verdict instead, ``Intake.heard``: the
        next request is checked again.)"""
        self.unanswered.pop(credential, None)
        if len(self.verdicts) >= self.max_verdicts:
            self.verdicts.pop(next(iter(self.verdicts)))
        self.verdicts.pop(credential, None)  # re-inserted last: the oldest go first
        now = self.clock()
        self.verdicts[credential] = Kept(
            verdict, now + self.ttl, now, self.cleared.number if cleared is None else cleared
        )
        return verdict

    def _unanswered(self, credential: str, before: Kept | None, status: int, why: str) -> Verdict:
        """The upstream could not say (``why``): the key's last verdict, extended within its
        grace, or the upstream's failure."""
        now = self.clock()
        last = before.confirmed + self.ttl + self.grace if before is not None else now
        if before is None or now >= last:
            if len(self.unanswered) >= self.max_verdicts:
                self.unanswered.pop(next(iter(self.unanswered)))
            failed = Unverified(status, f"the credential could not be checked: {why}")
            self.unanswered[credential] = (failed, now + self.timeout)
            return failed
        self.verdicts[credential] = Kept(
            before.verdict, min(now + self.ttl, last), before.confirmed, before.cleared
        )
        return before.verdict


async def upstream_is_authority(url: str, timeout: float) -> bool | None:
    """``CredentialCheck.probe`` of the upstream at ``url``, on a client of its own (``gpucache
    serve`` asks before it starts the server, to refuse with a line, not a traceback)."""
    upstream = Upstream(url, timeout)
    try:
        return await CredentialCheck(upstream, 0.0, timeout=timeout).probe()
    finally:
        await upstream.close()


async def keys_verdict(keys: KeyFile, values: tuple[str, ...]) -> Verdict:
    """The key file's verdict on a request's credentials (``values``, as sent): allowed when
    ``keys.allows`` them, the list first looked at again (``KeyFile.fresh``); otherwise a 401
    in OpenAI's shape, the upstream never asked."""
    await keys.fresh()
    if keys.allows(values):
        return Allowed()
    return Denied(
        401,
        {"content-type": "application/json"},
        wire.dumps(
            wire.error_body(
                "the API key is not one this server accepts" if values else "credentials are required",
                "invalid_request_error",
                "invalid_api_key",
                None,
            )
        ),
    )
