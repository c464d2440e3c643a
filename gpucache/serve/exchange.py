"""One request through the proxy as values: the ``Exchange`` it is, and the ``Outcome`` it ends
in. The proxy (proxy.py) runs an exchange to one outcome; one function maps an outcome to
HTTP, one records its metrics, and ``may_store`` alone decides what the cache keeps. vLLM's
OpenAI server is the model: a request object, a function that serves it, typed results.

Outcomes:
    Cached       answered from the cache (a stored answer, JSON or replayed as a stream)
    Fetched      this call's own upstream answer, stored where ``may_store`` allowed it
    Coalesced    another request's load of the same prompt, in the same tenant
    PassedThrough an upstream answer served as it came and not kept (an error status, say)
    Unauthorized the credential may not be served (the upstream's own 401/403, or the key file's)
    Bypassed     forwarded without the cache (a request it cannot stand for, a passthrough path)
    FailedOpen   the cache failed; the request went upstream without it
    Unavailable  the upstream could not be reached (502) or did not answer in time (504)
    Refused      the request itself was refused (400, 401, 413, 499)

Their names differ from the cache's own (``Hit``, ``Loaded``, ``Joined``: served.py), which the
proxy matches on first: one name per type, so no module imports either under an alias.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

from gpucache.cache.served import Hit
from gpucache.serve.keying import RequestKey
from gpucache.serve.tenancy import Refusal

# RFC 9111 section 1.2.2: a delta-seconds value past 2^31 is taken as 2^31
MAX_DELTA_SECONDS = 2**31
PATHS = {"chat": "chat/completions", "completions": "completions"}


@dataclass(frozen=True)
class CacheControl:
    """The request's Cache-Control, as HTTP means it (RFC 9111, section 5.2.1), and only ever
    about this request: ``max-age=N`` accepts a stored answer at most N seconds old (else the
    upstream answers and the fresh answer is stored); ``no-cache`` (or ``max-age=0``) reads
    nothing from the cache and stores the fresh answer; ``no-store`` stores nothing. How long
    an answer is kept is the server's setting (``ServeSettings.ttl``), never a client's: one
    client must not decide what the tenant's other clients are served."""

    no_cache: bool = False
    no_store: bool = False
    max_age: int | None = None

    @classmethod
    def parse(cls, header: str | None) -> CacheControl | Refusal:
        if not header:
            return cls()
        no_cache = no_store = False
        max_age = None
        for token in (t.strip().lower() for t in header.split(",")):
            name, _, value = token.partition("=")
            if name == "no-cache":
                no_cache = True
            elif name == "no-store":
                no_store = True
            elif name == "max-age":
                if not value.isascii() or not value.isdigit():
                    return Refusal(
                        400,
                        f"Cache-Control max-age must be whole seconds, got {value!r}",
                        "invalid_cache_control",
                    )
                # compared as text first: a value of thousands of digits is past the cap, and
                # int() refuses to read one (Python's limit on digits) with a ValueError
                digits = value.lstrip("0") or "0"
                long = len(digits) > len(str(MAX_DELTA_SECONDS))
                max_age = MAX_DELTA_SECONDS if long else min(int(digits), MAX_DELTA_SECONDS)
        return cls(no_cache or max_age == 0, no_store, max_age)

    @property
    def reads(self) -> bool:
        """Whether a stored answer may be served at all."""
        return not self.no_cache

    def fresh(self, hit: Hit) -> bool:
        """Whether ``hit`` is young enough for this request."""
        return self.max_age is None or hit.age <= self.max_age


def may_store(
    finish: str | None,
    replayable: bool,
    control: CacheControl,
    response_headers: Mapping[str, str] | None = None,
) -> bool:
    """Whether an upstream's complete answer (a 200 with text: the caller has checked) is kept,
    JSON or stream: finished ("stop", not cut short or turned into a tool call), its text alone
    replays it (no tool calls, refusal or reasoning beside it: a hit serves the text only), the
    request allows storing, and the upstream allows it (``upstream_allows_storing``)."""
    return (
        finish == "stop" and replayable and not control.no_store and upstream_allows_storing(response_headers)
    )


# What in an upstream's Cache-Control forbids keeping its answer for later requests: no-store
# and private are never stored (RFC 9111 §5.2.2.5, §5.2.2.7); no-cache, and a max-age or
# s-maxage of 0, may not be served without revalidating with the upstream, which a cache of
# generated answers cannot do, so they are not stored either (§5.2.2.4).
_FORBIDDING = frozenset({"no-store", "private", "no-cache"})


def upstream_allows_storing(headers: Mapping[str, str] | None) -> bool:
    """Whether the upstream's response headers let a shared cache keep the answer."""
    if not headers:
        return True
    if _varies(headers) or _expires_in(headers) == 0.0:
        return False
    for token in _tokens(headers, "cache-control"):
        name, _, arg = token.partition("=")
        name = name.strip()
        if name in _FORBIDDING:
            return False
        if name in ("max-age", "s-maxage") and arg.strip().strip('"') in ("0", "-0"):
            return False
    return True


def upstream_lifetime(headers: Mapping[str, str] | None) -> float | None:
    """How long the upstream lets a shared cache keep its answer, in seconds, or None where it
    does not say: ``s-maxage`` where given (it is for shared caches and overrides ``max-age``,
    RFC 9111 §5.2.2.10), else ``max-age``, less the answer's ``Age``. An entry lives no longer
    than this, nor than the cache's own ``ttl``. A malformed value says nothing."""
    if not headers:
        return None
    found: dict[str, int] = {}
    for token in _tokens(headers, "cache-control"):
        name, _, arg = token.partition("=")
        arg = arg.strip().strip('"')
        if name.strip() in ("max-age", "s-maxage") and arg.isascii() and arg.isdigit():
            found[name.strip()] = min(int(arg[:12]), MAX_DELTA_SECONDS)
    lifetime = found.get("s-maxage", found.get("max-age"))
    if lifetime is None:
        return _expires_in(headers)
    age = (headers.get("age") or "").strip()
    return max(0.0, float(lifetime - (int(age[:12]) if age.isascii() and age.isdigit() else 0)))


@dataclass(frozen=True)
class Exchange:
    """One cached-endpoint request, read and keyed: everything the proxy needs to run it."""

    kind: str  # "chat" or "completions"
    method: str
    headers: Any  # the client's request headers (a case-insensitive mapping)
    query: str  # the client's raw query string, forwarded as received on every path
    raw: bytes  # the body as the client sent it, forwarded as it is
    body: dict[str, Any]
    key: RequestKey
    control: CacheControl
    # seconds spent waiting on the upstream before the answer's headers were sent: the rest of
    # the exchange's time is the proxy's own (``x-gpucache-overhead-ms``)
    timing: dict[str, float] = field(default_factory=lambda: {"upstream": 0.0}, compare=False)
    # what went wrong on the way that the request survived (the errors metric's labels: "cache"
    # for a cache that failed open or an answer not kept), counted with its outcome (answers.record)
    notes: list[str] = field(default_factory=list, compare=False)
    holder: str = ""  # whose credentials it carries (tenancy.Identity.holder): its share of slots
    receive: Any = field(default=None, compare=False)  # the ASGI receive: whether the client is still there

    def waited_upstream(self, seconds: float) -> None:
        self.timing["upstream"] += seconds

    @property
    def endpoint(self) -> str:
        return PATHS[self.kind]


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Cached:
    hit: Hit
    answer: str
    stream: AsyncIterator[bytes] | None = None  # the replay, for a streamed request


@dataclass(frozen=True)
class Fetched:
    """This call's upstream answer: the upstream's own response (JSON), or its events as it
    sent them (a stream)."""

    status: int = 200
    headers: Any = None
    content: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    refused: str = ""  # the guard's rule where it refused the best stored prompt (x-gpucache-refused)


@dataclass(frozen=True)
class Coalesced:
    answer: str
    stream: AsyncIterator[bytes] | None = None


@dataclass(frozen=True)
class PassedThrough:
    status: int
    headers: Any
    content: bytes


@dataclass(frozen=True)
class Unauthorized:
    """The credential is refused before the cache is asked (auth.py): the upstream's own answer
    to it (or the key file's 401), relayed; nothing was looked up."""

    status: int
    headers: Any
    content: bytes


@dataclass(frozen=True)
class Forwarded:
    """The upstream's answer to a request forwarded as it came, to be relayed as it came back:
    its status and headers, and its body (JSON) or its byte stream with what closes the
    upstream's response once the client has read it."""

    status: int
    headers: Any
    content: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    close: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True)
class Bypassed:
    reason: str
    answer: Forwarded | None  # None: counted only (a test's outcome)


@dataclass(frozen=True)
class FailedOpen:
    error: BaseException
    answer: Forwarded


@dataclass(frozen=True)
class Unavailable:
    status: int  # 502 or 504
    message: str


@dataclass(frozen=True)
class Refused:
    status: int
    message: str
    code: str
    param: str | None = None
    kind: str = "bad_request"  # the errors metric's label


@dataclass(frozen=True)
class Shed:
    """Turned away before any work, for ``reason``: ``concurrency``, ``max_concurrency``
    requests (or the credential's share of them) were already past the exact tier;
    ``body_budget``, the bodies all requests hold at once would pass ``max_buffered_bytes``;
    ``rate_limit``, the credential sent past its ``tenant_rate`` (429, not 503: the client, not
    the proxy, is over its limit). The client is told when to come back (Retry-After); nothing
    was looked up or sent upstream."""

    retry_after: int
    reason: str = "concurrency"


Outcome = (
    Cached
    | Fetched
    | Coalesced
    | PassedThrough
    | Unauthorized
    | Bypassed
    | FailedOpen
    | Unavailable
    | Refused
    | Shed
)


def upstream_answer(outcome: Outcome) -> PassedThrough | None:
    """The upstream's own answer where ``outcome`` relays one (its status, headers and body: a
    streamed one's body is not read here), else None (a hit, a refusal, an unreachable
    upstream)."""
    answer = outcome.answer if isinstance(outcome, (Bypassed, FailedOpen)) else outcome
    if isinstance(answer, (Fetched, PassedThrough, Forwarded)):
        return PassedThrough(answer.status, answer.headers, answer.content)
    return None


# Vary names request headers the answer depends on (RFC 9111 §4.1): a cache keyed on the request
# body cannot tell those apart, so an answer that varies on any (``*`` included) is not kept.
# Two kinds aside, which never change the text a hit replays: Accept-Encoding (the proxy asks for
# no encoding and keeps decoded text) and CORS's Origin and preflight headers (they vary only the
# Access-Control-* headers, which a hit does not carry; vLLM sends Vary: Origin on every answer).
_VARY_IGNORED = frozenset(
    {"", "accept-encoding", "origin", "access-control-request-method", "access-control-request-headers"}
)


def _varies(headers: Mapping[str, str]) -> bool:
    return any(name not in _VARY_IGNORED for name in _tokens(headers, "vary"))


def _tokens(headers: Mapping[str, str], name: str) -> list[str]:
    """The comma-separated tokens of every ``name`` header, stripped and lower-cased (httpx's
    ``get_list``; one header at most for a plain mapping)."""
    values = headers.get_list(name) if hasattr(headers, "get_list") else [headers.get(name) or ""]
    return [token.strip().lower() for value in values for token in (value or "").split(",")]


def _expires_in(headers: Mapping[str, str]) -> float | None:
    """Seconds until the answer's ``Expires`` (from its ``Date``, else now), where it has one and
    no ``max-age`` or ``s-maxage`` overrides it; 0.0 for one in the past or malformed, which
    RFC 9111 §5.3 reads as already expired; None where it has none."""
    value, control = headers.get("expires"), (headers.get("cache-control") or "").lower()
    if value is None or "max-age" in control or "s-maxage" in control:
        return None
    try:
        expires = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0
    try:
        now = parsedate_to_datetime(headers.get("date") or "").timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        now = time.time()
    return min(max(0.0, expires - now), float(MAX_DELTA_SECONDS))
