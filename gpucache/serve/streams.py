"""Streams of the caching path: an upstream's server-sent events read and relayed as sent, a
stored answer replayed as a stream, and the error event that ends a stream whose upstream
failed. Every stream a client reads passes through ``Streams.closing``, so a client that goes
away closes the cache's stream and with it the upstream request."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from gpucache.serve import wire
from gpucache.serve.exchange import Exchange, PassedThrough, may_store
from gpucache.serve.keying import RequestKey
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.upstream import UpstreamUnavailable

log = logging.getLogger("gpucache.serve")


async def upstream_events(response: Any) -> AsyncIterator[tuple[dict[str, Any], bytes]]:
    """The JSON events of an upstream's server-sent-event stream, up to ``[DONE]``, each with
    the bytes to relay it by (``data: ...`` and a blank line). A cut connection raises
    ``UpstreamUnavailable``."""
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if isinstance(event, dict):
                yield event, f"data: {data}\n\n".encode()
    except httpx.TransportError as exc:
        raise UpstreamUnavailable(502, f"the upstream connection failed mid-stream: {exc!r}") from exc


@dataclass
class Relay:
    """A streamed load's side of the exchange: the upstream's events waiting to be relayed
    (one per piece the cache hands back), what the stream said of itself, and how it ended."""

    meta: wire.StreamMeta
    events: deque[bytes] = field(default_factory=deque)
    started: bool = False  # this call ran the upstream request (it did not join or hit)
    error_event: bool = False  # the upstream ended the stream with an error event
    refused: PassedThrough | None = None  # the upstream answered with an error status
    waited: bool = False  # the wait for the upstream's first event is counted in the exchange
    headers: Any = None  # the upstream's response headers, relayed with the stream
    text: list[str] = field(default_factory=list)  # the answer's pieces, as the cache sees them

    def drain(self) -> list[bytes]:
        out = list(self.events)
        self.events.clear()
        return out


class Streams:
    """The proxy's streams, counting what they see (a client gone, an upstream cut) in
    ``metrics``; ``keep`` stores a streamed answer that ``may_store`` allows."""

    def __init__(self, metrics: ProxyMetrics,
                 keep: Callable[[RequestKey, str, float | None], Awaitable[None]],
                 lifetime: Callable[[Any], float | None]) -> None:
        self.metrics, self.keep, self.lifetime = metrics, keep, lifetime

    async def closing(self, source: AsyncIterator[bytes], pieces: Any) -> AsyncIterator[bytes]:
        """``source`` to the client; a client gone mid-stream closes the cache's stream, and
        so the upstream request."""
        try:
            async for data in source:
                yield data
        except (asyncio.CancelledError, GeneratorExit):
            self.metrics.errors.labels("client_disconnect").inc()
            raise
        finally:
            await pieces.aclose()

    async def relayed(
        self, first: str | None, pieces: AsyncIterator[str], relay: Relay
    ) -> AsyncIterator[bytes]:
        """This call's own load: the upstream's events as it sent them, one per piece; then its
        ``[DONE]``, unless an error event ended it; a cut or failed upstream ends it with an
        error event made here."""
        for line in relay.drain():
            yield line
        if first is not None:
            try:
                async for _ in pieces:
                    for line in relay.drain():
                        yield line
            except UpstreamUnavailable as exc:
                for line in relay.drain():
                    yield line
                yield self.cut(exc)
                return
            except Exception as exc:  # past the first event: an error event, never a traceback
                log.exception("gpucache: a streamed load failed mid-stream")
                yield self.cut(exc)
                return
        for line in relay.drain():
            yield line
        if not relay.error_event:
            yield wire.DONE

    @staticmethod
    async def replay(
        meta: wire.StreamMeta, first: str | None, pieces: AsyncIterator[str], include_usage: bool
    ) -> AsyncIterator[bytes]:
        """A stored answer (a hit, or another call's load) as a stream of its text, framed as
        ``wire`` frames every replayed answer."""
        for line in wire.opening(meta):
            yield line
        if first is not None:
            yield wire.chunk(meta, content=first)
            async for piece in pieces:
                yield wire.chunk(meta, content=piece)
        for line in wire.ending(meta, include_usage):
            yield line

    def cut(self, exc: Exception) -> bytes:
        """The error event that ends a client's stream whose upstream failed mid-stream."""
        self.metrics.errors.labels("upstream_unavailable").inc()
        return wire.sse(wire.error_body(f"the upstream failed mid-stream: {exc}", "api_error"))

    async def raw_relay(self, response: Any) -> AsyncIterator[bytes]:
        """An upstream body passed through as bytes; a cut connection ends it with an error
        event (the body is a completion stream here), never a traceback."""
        try:
            async for part in response.aiter_raw():
                yield part
        except httpx.TransportError as exc:
            yield self.cut(exc)

    async def relay_and_store(self, response: Any, ex: Exchange, store: bool) -> AsyncIterator[bytes]:
        meta = wire.StreamMeta(ex.kind, "")
        parts: list[str] = []
        try:
            async for event, line in upstream_events(response):
                yield line
                if "error" in event:
                    return  # relayed; nothing stored
                delta = wire.delta_of(ex.kind, event, meta)
                if delta:
                    parts.append(delta)
        except UpstreamUnavailable as exc:
            yield self.cut(exc)
            return
        finally:
            await response.aclose()
        yield wire.DONE
        if store and may_store(200, "", meta.finish_reason, not meta.unreplayable, ex.control,
                               response.headers):
            await self.keep(ex.key, "".join(parts), self.lifetime(response.headers))
