"""What a request to a cached endpoint is before the cache sees it, in the order that bounds
what an untrusted client costs: whose it is, from the headers and query string alone
(tenancy.py); whether its credential may be served (auth.py); only then its body read and
keyed, a large one off the event loop. A client the cache will not serve is answered before a
byte of its body is parsed.

    Intake.accept(kind, request) -> Exchange               read and keyed: the proxy runs it
                                 -> Outcome                ended here (400, 401, 408, 413, 499;
                                                           429 past the credential's rate,
                                                           503 past the body budget;
                                                           the upstream's 401/403; 502-504)
    Intake.budget.release(request)                         its body's bytes back to the budget,
                                                           once it is answered, whatever its outcome
    unless_gone(receive, work)                             work, or a 499 where the client
                                                           hangs up first (work cancelled)
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gpucache.extras import missing

try:
    from starlette.requests import ClientDisconnect, Request
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc

from gpucache.cache.replication import ClearedPrefixes
from gpucache.serve.auth import CredentialCheck, Denied, Unverified, keys_verdict
from gpucache.serve.exchange import (
    CacheControl,
    Exchange,
    Outcome,
    Refused,
    Shed,
    Unauthorized,
    Unavailable,
    upstream_answer,
)
from gpucache.serve.keyfile import KeyFile
from gpucache.serve.keying import (
    MAX_JSON_VALUES,
    BadRequest,
    RequestKey,
    parse_json,
    request_key,
    uncounted_key,
    values_bound,
)
from gpucache.serve.rates import RateLimits
from gpucache.serve.settings import GATEWAY_TOKEN_HEADER, ServeSettings
from gpucache.serve.slots import Slots
from gpucache.serve.tenancy import Identity, Refusal
from gpucache.serve.upstream import Upstream

log = logging.getLogger("gpucache.serve")

# A body past this is parsed and keyed on a worker thread, so a client's megabytes never stall
# the loop that answers everyone's repeats; a small body stays on the loop, where the hop to a
# thread would be most of its cost
PARSE_ON_LOOP_BYTES = 64 * 1024


class TooLarge(ValueError):
    pass


class TooSlow(TimeoutError):
    """The body did not arrive within ``body_timeout`` of the request's headers."""


class OverBudget(MemoryError):
    """The bodies all requests hold at once would pass ``max_buffered_bytes``."""


class BodyBudget:
    """The bytes of request bodies the proxy holds at once, across every request: each chunk is
    counted as it arrives and the request's whole count given back when it is answered. Why: a
    body is buffered whole (it is keyed, then forwarded), so without a bound on the sum, many
    clients each sending a body under ``max_body_bytes`` hold as much memory as they like (64
    bodies of 7.5 MB took the proxy from 1.8 to 3.0 GB, kept). A request that would pass the
    budget is shed (503, Retry-After) and its connection closed, the rest never read. One event
    loop counts, so no lock is needed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, request: Request, size: int) -> None:
        """``size`` more bytes of ``request``'s body held, or ``OverBudget`` (nothing taken)."""
        if self.held + size > self.limit:
            raise OverBudget(f"the proxy holds its limit of {self.limit} bytes of request bodies")
        self.held += size
        request.state.buffered = getattr(request.state, "buffered", 0) + size

    def release(self, request: Request) -> None:
        """Everything ``request`` took, given back (once: a second call gives nothing)."""
        self.held -= getattr(request.state, "buffered", 0)
        request.state.buffered = 0


def keyed(kind: str, raw: bytes, scope: str) -> tuple[Any, RequestKey]:
    """A body parsed and keyed under ``scope`` (``BadRequest`` where it cannot be)."""
    body = parse_json(raw)
    return body, request_key(kind, body, scope)


async def read_body(request: Request, limit: int, deadline: float, budget: BodyBudget) -> bytes:
    """The whole body, at most ``limit`` bytes, arrived within ``deadline`` seconds, each chunk
    taken from ``budget`` as it arrives: a client that sends headers and then trickles or
    withholds its body would otherwise hold a connection and its buffered bytes for as long as
    it likes (``TooSlow``; the connection is then closed after the answer, the rest of the body
    never read, as it is past the budget)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the request body is larger than {limit} bytes")
    try:
        return await asyncio.wait_for(_collect(request, limit, budget), deadline)
    except asyncio.TimeoutError:
        request.state.body_abandoned = True
        raise TooSlow(f"the request body did not arrive within {deadline:g} seconds") from None
    except OverBudget:
        request.state.body_abandoned = True
        raise


async def _collect(request: Request, limit: int, budget: BodyBudget) -> bytes:
    body = bytearray()
    async for part in request.stream():
        if len(body) + len(part) > limit:
            raise TooLarge(f"the request body is larger than {limit} bytes")
        budget.take(request, len(part))
        body += part
    return bytes(body)


def unforwardable(headers: Any) -> Refused | None:
    """A 400 for a header value that is not ASCII: the proxy forwards the headers, and one it
    cannot write out would otherwise fail as an upstream error (502) that never reached the
    upstream. HTTP allows such bytes only as obsolete text (RFC 9110 §5.5); OpenAI clients never
    send them."""
    for name, value in headers.items():
        if not value.isascii():
            return Refused(400, f"the {name} header is not ASCII", "invalid_header")
    return None


async def disconnected(receive: Callable[[], Awaitable[Any]]) -> None:
    """Returns when the client has hung up (the ASGI ``http.disconnect``), the body read."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(receive: Callable[[], Awaitable[Any]], work: Awaitable[Outcome]) -> Outcome:
    """``work``'s outcome, or, where the client hangs up first (``receive`` says so), ``work``
    cancelled (its upstream request with it: httpx closes the connection, and a model server
    stops generating) and a 499: the slot is free at once, not when the upstream would have
    finished. Requests that joined this one's load then load their own (``LoadAbandoned``).
    An exact repeat is not watched: it is answered before a watch could matter."""
    running = asyncio.ensure_future(work)
    watching = asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait((running, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
    if running.done():
        return running.result()
    running.cancel()
    try:
        await running
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise  # this request's own task is being cancelled (shutdown): not the client
    except Exception:  # noqa: BLE001 - what the cancelled work raised on its way out
        log.debug("gpucache: a request whose client hung up ended with an error", exc_info=True)
    return Refused(499, "the client disconnected", "client_disconnect", kind="client_disconnect")


def leaves_body_unread(request: Request) -> bool:
    """Whether a request answered now leaves a large body unread: then the connection is closed
    after the answer (``connection: close``) rather than kept, which would read and discard
    every byte a client refused before its body was read keeps sending."""
    if getattr(request.state, "body_abandoned", False):
        return True
    if getattr(request.state, "body_read", False):
        return False
    declared = request.headers.get("content-length", "")
    return "transfer-encoding" in request.headers or (
        declared.isdigit() and int(declared) > PARSE_ON_LOOP_BYTES
    )


class Intake:
    """The front of the caching path: ``config``'s tenancy and its ``auth`` mode's checker."""

    def __init__(
        self,
        config: ServeSettings,
        upstream: Upstream,
        cleared: ClearedPrefixes | None = None,
        slots: Slots | None = None,
    ) -> None:
        """``cleared``: the cache's clears under a prefix (a revoke, here or on any replica),
        which end a credential's kept verdict. ``slots``: the proxy's, told of each credential
        whose request passes its check, and asked whether it holds its share already."""
        self.config = config
        self.slots = slots
        self.budget = BodyBudget(config.max_buffered_bytes)
        self.rates = (
            None if config.tenant_rate is None else RateLimits(config.tenant_rate, config.tenant_burst)
        )
        self.credentials: CredentialCheck | KeyFile | None = None
        if config.auth == "upstream":
            self.credentials = CredentialCheck(
                upstream,
                config.auth_ttl,
                timeout=config.auth_timeout,
                grace=config.auth_grace,
                max_checks=config.max_concurrency,
                cleared=cleared,
            )
        elif config.auth == "keys":
            assert config.keys_file is not None
            self.credentials = KeyFile(config.keys_file)

    async def body(self, request: Request) -> bytes | Refused | Shed:
        """The request's body under ``config``'s limits, or why it is refused: 413 past the
        size, 408 past the deadline (the client may send it again on a new connection), 499
        where the client hung up, shed (503, Retry-After) past the budget of bytes all requests
        may hold at once. Its bytes stay taken from the budget until ``budget.release``."""
        config = self.config
        try:
            return await read_body(request, config.max_body_bytes, config.body_timeout, self.budget)
        except TooLarge as exc:
            return Refused(413, str(exc), "request_too_large")
        except TooSlow as exc:
            return Refused(408, str(exc), "request_timeout", kind="body_timeout")
        except OverBudget:
            return Shed(config.retry_after, reason="body_budget")
        except ClientDisconnect:
            return Refused(499, "the client disconnected", "client_disconnect", kind="client_disconnect")

    async def accept(self, kind: str, request: Request) -> Exchange | Outcome:
        """The request's exchange, or the outcome that ends it before the cache is asked.
        In the order that bounds what an untrusted client costs: whose it is, from the headers
        alone (tenancy.py); whether its credential may be served (auth.py); only then the body
        read and parsed (a large one off the event loop)."""
        identity = await self.vetted(request)
        if not isinstance(identity, Identity):
            return identity
        if self.slots is not None and not await self.slots.turn(identity.holder, self.config.retry_after):
            # shed from its headers: reading and parsing the body of a request that is then
            # shed would cost the others what the share is there to spare them
            return Shed(self.config.retry_after)
        control = (
            CacheControl()
            if self.config.ignore_client_cache_control
            else CacheControl.parse(request.headers.get("cache-control"))
        )
        if isinstance(control, Refusal):
            return Refused(control.status, control.message, control.code)
        return await self.receive(kind, request, identity, control)

    async def vetted(self, request: Request) -> Identity | Outcome:
        """Whose the request is and whether its credential may pass, from its headers and query
        alone, before a byte of its body is read: on every path, cached or passed through, so a
        client without a credential the proxy would serve never has its body buffered."""
        unsendable = unforwardable(request.headers)
        if unsendable is not None:
            return unsendable
        if not self.from_gateway(request.headers):
            return Refused(
                401,
                f"this proxy serves its gateway only: a valid {GATEWAY_TOKEN_HEADER} is required",
                "invalid_gateway_token",
                kind="unauthorized",
            )
        identity = self.config.tenancy.identify(request.headers, request.url.query)
        if isinstance(identity, Refusal):
            kind_ = "unauthorized" if identity.status == 401 else "bad_request"
            return Refused(identity.status, identity.message, identity.code, kind=kind_)
        wait = self.rates.take(identity.holder) if self.rates is not None else None
        if wait is not None:  # before its credential is checked: a flood costs no upstream check
            return Shed(wait, reason="rate_limit")
        denied = await self.authenticated(identity, request)
        if denied is not None:
            return denied
        if self.slots is not None:  # heard from only once its credential passes: a junk key
            self.slots.seen(identity.holder)  # never binds another's share
        return identity

    def from_gateway(self, headers: Any) -> bool:
        """Whether the request comes through the trusted front, where one is configured (the
        gateway token, compared in constant time); True where none is."""
        token = self.config.gateway_token
        if token is None:
            return True
        given = headers.get(GATEWAY_TOKEN_HEADER) or ""
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode())

    async def receive(
        self, kind: str, request: Request, identity: Identity, control: CacheControl
    ) -> Exchange | Refused | Shed:
        """The body read and keyed, or why it is refused."""
        raw = await self.body(request)
        if not isinstance(raw, bytes):
            return raw
        request.state.body_read = True
        body: dict[str, Any] = {}  # not parsed where it is forwarded from ``raw`` as it came
        if values_bound(raw) > MAX_JSON_VALUES:  # never parsed, keyed or walked
            key = uncounted_key(kind)
        else:
            try:
                if len(raw) > PARSE_ON_LOOP_BYTES:  # parsing megabytes would stall every other request
                    body, key = await asyncio.to_thread(keyed, kind, raw, identity.scope)
                else:
                    body, key = keyed(kind, raw, identity.scope)
            except BadRequest as exc:
                return Refused(400, str(exc), "invalid_request", exc.param)
        return Exchange(
            kind,
            request.method,
            request.headers,
            request.url.query,
            raw,
            body,
            key,
            control,
            holder=identity.holder,
            receive=request.receive,
        )

    def heard(self, holder: str, outcome: Outcome) -> None:
        """What the upstream answered ``holder``'s request, seen after the fact: a 401 or 403
        drops the credential's verdict (auth = upstream), so its next request, hit or miss, is
        checked again. Not kept as a refusal: a gateway refuses one model to a key it allows
        (LiteLLM's per-key model lists answer 401), and one end user asking for that model
        would lock every user of a shared key out; a revoked key is refused by the check."""
        answer = upstream_answer(outcome)
        if not isinstance(self.credentials, CredentialCheck) or answer is None:
            return
        if answer.status in (401, 403):
            self.credentials.forget(holder)

    def forget(self, holder: str) -> None:
        """Drop ``holder``'s verdict (``/admin/revoke``): its next request is checked again."""
        if isinstance(self.credentials, CredentialCheck):
            self.credentials.forget(holder)

    async def authenticated(self, identity: Identity, request: Request) -> Outcome | None:
        """None where the request's credential may be served from the cache (auth.py); else
        what it gets instead: the upstream's own refusal (or the key file's 401), and nothing
        from the cache; the upstream's failure where it could not be checked."""
        if self.credentials is None:
            return None
        if isinstance(self.credentials, KeyFile):
            verdict = await keys_verdict(self.credentials, identity.values)
        else:
            headers = self.config.tenancy.checked(request.headers)
            verdict = await self.credentials.check(identity.holder, headers, request.url.query)
        if isinstance(verdict, Denied):
            return Unauthorized(verdict.status, verdict.headers, verdict.content)
        if isinstance(verdict, Unverified):
            return Unavailable(verdict.status, verdict.message)
        return None
