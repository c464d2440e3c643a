"""The caching path of ``/v1/chat/completions`` and ``/v1/completions``: an exchange run to one
outcome (exchange.py), then answered and counted, each in one place.

    intake.accept(kind, request)                       intake.py: whose, allowed, then the body
                            -> Exchange | Outcome      read and keyed, or how the request ended
    admit(exchange)         -> Outcome                 run, or Shed past max_concurrency
    run(exchange)           -> Outcome                 the cache, the upstream, or both
    respond(outcome)        -> Response                answers.respond: the only place an
                                                       outcome becomes HTTP
    record(outcome)                                    answers.record: the only place metrics
                                                       are counted
    streams (relayed, replayed, cut)                   streams.py

The cache is asked through ``SemanticCache.aget_or_load`` / ``aget_or_load_streaming``, so
concurrent identical misses make one upstream call (within one tenant: the tenant opens every
scope) and concurrent lookups share one embedder batch; what it answers is matched once:
``Found(hit)``, ``Loaded(the upstream's response)`` or ``Joined(another request's text)``. The
loader answers the cache ``Keep(text, response)`` where ``may_store`` allows it, else
``ServeOnly(response)``: served to its caller, never to a waiter, who loads its own. A streamed
miss is relayed event by event as the upstream sent it (tool-call deltas, usage and all), its
text collected by the cache (``Streams.pieces``, the one streamed load, which a refresh reads
too); an upstream error event or a cut connection ends the client's stream with an error
event, and nothing is stored.

The cache fails open: if the lookup fails or passes its deadline, the request goes upstream as
if the cache were not there, and the failure is counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, cast

from gpucache.conversation.value import Prompt
from gpucache.extras import missing

try:
    import httpx
    from starlette.requests import Request
    from starlette.responses import Response
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc

from gpucache.cache.batching import LookupTimeout
from gpucache.cache.semantic import SemanticCache
from gpucache.cache.served import Found, Framed, Hit, Joined, Keep, Loaded, Pieces, Served, ServeOnly, Stream
from gpucache.cache.validation import MAX_TTL_SECONDS
from gpucache.serve import answers, wire
from gpucache.serve.exchange import (
    PATHS,
    Bypassed,
    CacheControl,
    Cached,
    Coalesced,
    Exchange,
    FailedOpen,
    Fetched,
    Forwarded,
    Outcome,
    PassedThrough,
    Shed,
    Unavailable,
    may_store,
    upstream_lifetime,
)
from gpucache.serve.intake import Intake, leaves_body_unread, unless_gone
from gpucache.serve.keying import RequestKey
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.settings import ServeSettings
from gpucache.serve.slots import Slots
from gpucache.serve.streams import Streams, UpstreamPieces
from gpucache.serve.tenancy import Identity
from gpucache.serve.upstream import Upstream, UpstreamUnavailable, calling_upstream

log = logging.getLogger("gpucache.serve")
# Answers of timed-out lookups waiting to be stored after they were sent: each store embeds,
# and the embedder is what is behind, so past this many a new one is skipped (and counted)
# rather than queued without bound; the prompt is stored the next time it misses.
MAX_PENDING_STORES = 256


def storable(kind: str, response: Any, control: CacheControl) -> str | None:
    """The text to keep of an upstream's whole answer, or None (``may_store``)."""
    if response.status_code != 200:
        return None
    try:
        text, finish, replayable = wire.answer_of(kind, response.json())
    except (ValueError, RecursionError):  # not JSON, or nested past what a parser follows
        return None
    allowed = isinstance(text, str) and may_store(finish, replayable, control, response.headers)
    return text if allowed else None


class Proxy:
    def __init__(
        self, config: ServeSettings, cache: SemanticCache, upstream: Upstream, metrics: ProxyMetrics
    ) -> None:
        self.config, self.cache, self.upstream, self.metrics = config, cache, upstream, metrics
        self.storing: set[asyncio.Task[None]] = set()  # answers being stored after they were sent
        self.slots = Slots(config.max_concurrency, config.max_tenant_concurrency)  # admit
        self.streams = Streams(metrics, self.store)
        self.intake = Intake(config, upstream, cache.cleared_prefixes, slots=self.slots)

    async def completion(self, kind: str, request: Request) -> Response:
        """The request answered; its body's bytes held (intake.BodyBudget) until it is."""
        try:
            return await self.answer(kind, request)
        finally:
            self.intake.budget.release(request)

    async def answer(self, kind: str, request: Request) -> Response:
        started = time.perf_counter()
        accepted = await self.intake.accept(kind, request)
        exchange = accepted if isinstance(accepted, Exchange) else None
        outcome = await self.admit(accepted) if isinstance(accepted, Exchange) else accepted
        response = self.answered(request, PATHS[kind], outcome, exchange, read=exchange is not None)
        if self.config.overhead_header:  # the operator's clock; not every client's (settings.py)
            # the proxy's own time: to the answer's headers, less what the upstream took meanwhile
            upstream = exchange.timing["upstream"] if exchange is not None else 0.0
            overhead = max(0.0, time.perf_counter() - started - upstream)
            response.headers["x-gpucache-overhead-ms"] = f"{1000 * overhead:.2f}"
        return response

    # ------------------------------------------------------------------------- run

    async def admit(self, ex: Exchange) -> Outcome:
        """``run``, for at most ``max_concurrency`` requests past the exact tier at a time
        (waiting on a lookup or the upstream, until the answer's headers), and, while another
        credential is active, at most ``max_tenant_concurrency`` of one credential's in the
        cache before they go upstream (slots.py says why). Past the global bound a request is
        shed (503, Retry-After), not queued behind a saturated embedder: a queue longer than
        the lookup deadline only turns waits into timeouts, and Retry-After sends the client
        (the OpenAI clients honour it) or a balancer where there is room. Past its share a
        request waits for its own credential's turn, up to ``retry_after``, from its headers
        (intake.py) and again here, then is shed. An exact repeat takes no turn and is taken
        past the global bound (answered on the loop, it costs no slot)."""
        repeat = (
            ex.key.bypass is None
            and ex.control.reads
            and self.cache.may_hold(ex.key.prompt, scope=ex.key.scope)
        )
        slots = self.slots
        if repeat and (slots.full() or slots.at_share(ex.holder)):
            return await self.run(ex)  # answered on the loop: it holds no slot
        if slots.full() or not await slots.turn(ex.holder, self.config.retry_after) or slots.full():
            return Shed(self.config.retry_after)
        with slots.held(ex.holder):
            if repeat:
                return await self.run(ex)
            return await unless_gone(ex.receive, self.run(ex))

    async def run(self, ex: Exchange) -> Outcome:
        if ex.key.bypass is not None:
            forwarded = await self.forward_exchange(ex)
            return forwarded if isinstance(forwarded, Unavailable) else Bypassed(ex.key.bypass, forwarded)
        if not ex.control.reads:
            return await self.load(ex, refresh=True)
        return await self.stored_before(ex) or await self.load(ex)

    async def load(self, ex: Exchange, refresh: bool = False) -> Outcome:
        """The cache asked, the upstream loading a miss (``run_json``, ``run_stream``). With
        ``refresh`` the upstream answers, and its answer replaces the stored one as a miss's is
        stored (policy and admission permitting; a concurrent request for the prompt joins it):
        for ``no-cache``, ``max-age=0`` and a hit older than the request's ``max-age``."""
        return await (self.run_stream if ex.key.stream else self.run_json)(ex, refresh)

    async def stored_before(self, ex: Exchange) -> Cached | None:
        """The answer an earlier version stored for exactly this conversation, where it holds
        one: before a conversation's turns were carried as its context, every one was in the scope
        (``RequestKey.legacy_scope``), and such an entry stays served for its exact repeat until
        it expires. Asked only where the lock-free check finds one, so it costs nothing else."""
        legacy, text = ex.key.legacy_scope, ex.key.text
        if legacy is None or text is None or not self.cache.may_hold(text, scope=legacy):
            return None
        found = await self.cache.aget(text, scope=legacy, threshold=1.0)
        if found is None or not found.exact or not ex.control.fresh(found):
            return None
        return self.cached(ex, found)

    async def run_json(self, ex: Exchange, refresh: bool = False) -> Outcome:
        async def loader(text: Prompt) -> Keep[httpx.Response] | ServeOnly[httpx.Response]:
            response = await self.send_upstream(ex)
            ex.timing["answer"] = ex.timing["upstream"]  # the whole answer's wait
            return self.keeping(ex, response)

        served = await self.ask(
            ex, self.cache.aget_or_load(ex.key.prompt, loader, scope=ex.key.scope, refresh=refresh)
        )
        if isinstance(served, Outcome):
            return served
        if served.failed is not None:  # the upstream answered; keeping it failed: served, counted
            log.error("gpucache: storing an answer failed", exc_info=served.failed)
            ex.notes.append("cache")
        assert served.value is not None
        return self.loaded(served.value, served.refused)

    async def run_stream(self, ex: Exchange, refresh: bool = False) -> Outcome:
        async def opener(text: Prompt) -> Stream[Any] | ServeOnly[PassedThrough]:
            return await self.open_stream(ex)

        served = await self.ask(
            ex, self.cache.aget_or_load_streaming(ex.key.prompt, opener, scope=ex.key.scope, refresh=refresh)
        )
        if isinstance(served, Outcome):
            return served
        if served.pieces is None:  # the upstream refused: its answer, kept from everyone
            assert isinstance(served.value, PassedThrough)
            return served.value
        return await self.relaying(served.value, cast("Pieces[Framed[bytes]]", served.pieces), served.refused)

    async def ask(self, ex: Exchange, call: Awaitable[Served[Any]]) -> Loaded[Any] | Outcome:
        """This call's load, or how asking the cache ended: a stored answer (a hit fresh enough
        for the request, else refreshed) or another request's load, each answered as the request
        asked (JSON or a stream); the upstream unreachable (the loader's errors are all
        ``UpstreamUnavailable``); or the cache itself failed (``fail_open``)."""
        try:
            served = await call
        except UpstreamUnavailable as down:
            return Unavailable(down.status, str(down))
        except Exception as exc:
            return await self.fail_open(ex, exc)
        ex.timing["lookup"] = served.lookup_seconds
        if isinstance(served, Found):
            if not ex.control.fresh(served.hit):
                return await self.load(ex, refresh=True)
            return self.cached(ex, served.hit)
        if isinstance(served, Joined):
            if ex.key.stream:
                return Coalesced("", stream=self.replayed(ex, served.text))
            return Coalesced(served.text)
        return served

    def cached(self, ex: Exchange, hit: Hit) -> Cached:
        """A stored answer, as JSON or replayed as a stream, as the request asked."""
        if not ex.key.stream:
            return Cached(hit, hit.response)
        return Cached(hit, "", stream=self.replayed(ex, hit.response))

    def replayed(self, ex: Exchange, answer: str) -> AsyncIterator[bytes]:
        meta = wire.StreamMeta(ex.kind, ex.body["model"])
        return self.streams.replay(meta, self.cache.replay_chunks(answer), ex.key.include_usage)

    async def relaying(self, headers: Any, pieces: Pieces[Framed[bytes]], refused: str = "") -> Outcome:
        """This call's streamed load to its client, once its first event is in (an upstream that
        fails before it is a 502, after it an error event in the stream)."""
        first: Framed[bytes] | None = None
        try:
            first = await pieces.__anext__()
        except StopAsyncIteration:
            pass
        except UpstreamUnavailable as down:
            return Unavailable(down.status, str(down))
        except Exception as exc:
            log.exception("gpucache: a streamed load failed before its first event")
            return Unavailable(502, f"the upstream stream failed: {type(exc).__name__}")
        streams = self.streams
        return Fetched(
            headers=headers, stream=streams.closing(streams.relayed(first, pieces), pieces), refused=refused
        )

    async def past_the_cache(self, ex: Exchange) -> Outcome:
        """A lookup that timed out: the upstream answers at once, and a complete answer is
        stored after it has gone (``put``: its embedding waits on the embedder that is slow,
        which a lookup before the load would wait on again), so the cache still warms."""
        try:
            if ex.key.stream:
                opened = await self.open_stream(ex)
                if isinstance(opened, ServeOnly):
                    assert opened.value is not None
                    return opened.value
                pieces = cast(UpstreamPieces, opened.chunks)
                return await self.relaying(opened.value, self.streams.storing(pieces, ex.key))
            response = await self.send_upstream(ex)
        except UpstreamUnavailable as down:
            return Unavailable(down.status, str(down))
        keeping = self.keeping(ex, response)
        if isinstance(keeping, Keep) and keeping.text is not None:
            self.store_later(ex.key, keeping.text, keeping.ttl)
        return self.loaded(response)

    def keeping(
        self, ex: Exchange, response: httpx.Response
    ) -> Keep[httpx.Response] | ServeOnly[httpx.Response]:
        """A whole upstream answer, for the cache: its text kept (for the upstream's lifetime
        where shorter than the cache's) where ``storable`` allows, else served only."""
        answer = storable(ex.kind, response, ex.control)
        if answer is None:
            return ServeOnly(response)
        return Keep(answer, response, ttl=self.shorter_lived(response.headers))

    async def send_upstream(self, ex: Exchange) -> httpx.Response:
        """The exchange's request to the upstream, its wait counted as the upstream's; an error
        of any kind is ``UpstreamUnavailable`` (what the proxy answers 502 or 504 for)."""
        self.slots.upstream_bound()
        with calling_upstream(ex.waited_upstream, "the upstream request"):
            return await self.upstream.send("POST", ex.endpoint, ex.headers, ex.raw, params=ex.query)

    async def open_stream(self, ex: Exchange) -> Stream[Any] | ServeOnly[PassedThrough]:
        """The exchange's stream opened upstream: its headers and pieces (``Streams.pieces``),
        or, where the upstream answered with an error status, that answer, served only."""
        self.slots.upstream_bound()
        begun = time.perf_counter()  # the stream's first event is timed from here too
        with calling_upstream(ex.waited_upstream, "the upstream stream"):
            response = await self.upstream.open(ex.endpoint, ex.headers, ex.raw, params=ex.query)
        if response.status_code != 200:
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            return ServeOnly(PassedThrough(response.status_code, response.headers, content))
        lifetime = self.shorter_lived(response.headers)
        pieces = self.streams.pieces(response, ex, begun, lifetime)
        return Stream(response.headers, UpstreamPieces(pieces, response))

    def shorter_lived(self, headers: Any) -> float | None:
        """The upstream's lifetime for its answer (``upstream_lifetime``) where it is shorter
        than the cache's own ``ttl``, and never past the longest an entry may live (ten years:
        HTTP allows up to 2^31 s, and an entry kept "for ever" by a cache with no ``ttl`` is
        kept that long); None where the cache's applies."""
        lifetime, ttl = upstream_lifetime(headers), self.cache.ttl
        if lifetime is None or (ttl is not None and lifetime >= ttl):
            return None
        return min(lifetime, float(MAX_TTL_SECONDS))

    def store_later(self, key: RequestKey, answer: str, ttl: float | None = None) -> None:
        """``store`` after the answer has gone, held until done; past ``MAX_PENDING_STORES``
        waiting, skipped and counted (the embedder is far behind)."""
        if len(self.storing) >= MAX_PENDING_STORES:
            self.metrics.errors.labels("store_backlog").inc()
            return
        task = asyncio.create_task(self.store(key, answer, ttl))
        self.storing.add(task)  # held until done: a task only the loop knows may be collected
        task.add_done_callback(self.storing.discard)

    async def fail_open(self, ex: Exchange, exc: Exception) -> Outcome:
        log.warning("gpucache: the cache failed (%r); this request goes upstream without it", exc)
        ex.notes.append("cache")
        if isinstance(exc, LookupTimeout):
            # the cache is slow (a load spike), not broken: the answer is still kept, so the cache warms
            # under load; stored after the answer is sent (storing embeds: the embedder is what is slow)
            return await self.past_the_cache(ex)
        forwarded = await self.forward_exchange(ex)
        return forwarded if isinstance(forwarded, Unavailable) else FailedOpen(exc, forwarded)

    # ------------------------------------------------------------------------- answer, store

    def answered(
        self, request: Request, endpoint: str, outcome: Outcome, ex: Exchange | None, read: bool
    ) -> Response:
        """``outcome`` recorded (and heard as the upstream's word on the credential) and made
        HTTP; where its body was not ``read``, a request that leaves a large one unread closes
        its connection after the answer (``leaves_body_unread``)."""
        answers.record(self.metrics, endpoint, outcome, ex)
        if ex is not None:
            self.intake.heard(ex.holder, outcome)
        response = answers.respond(ex, outcome, self.config.max_concurrency)
        if not read and leaves_body_unread(request):
            response.headers["connection"] = "close"
        return response

    def loaded(self, response: httpx.Response, refused: str = "") -> Fetched:
        return Fetched(response.status_code, response.headers, response.content, refused=refused)

    async def store(self, key: RequestKey, answer: str, ttl: float | None = None) -> None:
        """``answer`` kept for ``key``, for ``ttl`` seconds (None: the cache's own ttl)."""
        try:
            await asyncio.to_thread(self.cache.put, key.prompt, answer, scope=key.scope, ttl=ttl)
        except Exception:  # the answer is served either way: a failed store is counted, not fatal
            log.exception("gpucache: storing an answer failed")
            self.metrics.errors.labels("cache").inc()

    async def forward(
        self, path: str, method: str, headers: Any, query: Any, body: bytes, stream: bool
    ) -> Forwarded | Unavailable:
        """The request as it came, to the upstream, and its answer as it came back (as a value:
        answers.respond makes it HTTP)."""
        try:
            if not stream:
                response = await self.upstream.send(method, path, headers, body, params=query)
                return Forwarded(response.status_code, response.headers, response.content)
            response = await self.upstream.open(path, headers, body, params=query)
        except UpstreamUnavailable as down:
            return Unavailable(down.status, str(down))
        return Forwarded(
            response.status_code,
            response.headers,
            stream=self.streams.raw_relay(response),
            close=response.aclose,
        )

    async def forward_exchange(self, ex: Exchange) -> Forwarded | Unavailable:
        """``forward`` for a cached endpoint's request, its wait counted as the upstream's."""
        self.slots.upstream_bound()
        begun = time.perf_counter()
        try:
            return await self.forward(ex.endpoint, ex.method, ex.headers, ex.query, ex.raw, ex.key.stream)
        finally:
            ex.waited_upstream(time.perf_counter() - begun)

    async def passthrough(self, path: str, label: str, request: Request) -> Response:
        """An allow-listed path (passthrough.py), forwarded unchanged and never cached;
        ``label`` names it in metrics (the rule, never a client's own path). Its credential is
        checked and its body bounded as a cached endpoint's are, the credential first; a header
        that cannot be forwarded is a 400."""
        vetted = await self.intake.vetted(request)
        try:  # the body's bytes held (intake.BodyBudget) until it is forwarded
            body = await self.intake.body(request) if isinstance(vetted, Identity) else vetted
            forwarded = (
                body
                if not isinstance(body, bytes)
                else await self.forward(path, request.method, request.headers, request.url.query, body, False)
            )
        finally:
            self.intake.budget.release(request)
        outcome = Bypassed("endpoint", forwarded) if isinstance(forwarded, Forwarded) else forwarded
        return self.answered(request, label, outcome, None, read=isinstance(body, bytes))
