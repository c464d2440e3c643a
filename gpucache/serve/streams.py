"""Streams of the caching path: an upstream's server-sent events read and relayed as sent, a
stored answer replayed as a stream, and the error event that ends a stream whose upstream
failed. Every stream a client reads passes through ``Streams.closing``, so a client that goes
away closes the cache's stream and with it the upstream request."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from gpucache.extras import missing

try:
    import httpx
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc

from gpucache.cache.served import Framed, Keep, ServeOnly
from gpucache.serve import wire
from gpucache.serve.exchange import Exchange, may_store
from gpucache.serve.keying import RequestKey
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.upstream import UpstreamUnavailable

log = logging.getLogger("gpucache.serve")
# What a streamed load's pieces are: each upstream event's text ("" for an event with none)
# framed by its bytes for the client, then the stream's end (its ``[DONE]`` in the same way),
# and last, whether the text may be kept
Piece = Framed[bytes] | Keep[None] | ServeOnly[None]


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


class UpstreamPieces:
    """An upstream stream's pieces (``Streams.pieces``) with the response they read: closing
    them closes the response, whether or not they were started (an async generator never
    started runs no ``finally``)."""

    def __init__(self, pieces: AsyncGenerator[Piece, None], response: Any) -> None:
        self._pieces, self._response = pieces, response

    def __aiter__(self) -> AsyncGenerator[Piece, None]:
        return self._pieces

    async def aclose(self) -> None:
        try:
            await self._pieces.aclose()
        finally:
            await self._response.aclose()


class Streams:
    """The proxy's streams, counting what they see (a client gone, an upstream cut, the
    upstream's time to the end of its stream) in ``metrics``: each happens after the answer's
    headers have gone and its outcome was recorded, so it is counted where it happens.
    ``keep`` stores a refreshed stream's answer."""

    def __init__(
        self, metrics: ProxyMetrics, keep: Callable[[RequestKey, str, float | None], Awaitable[None]]
    ) -> None:
        self.metrics, self.keep = metrics, keep

    async def pieces(
        self, response: Any, ex: Exchange, begun: float, lifetime: float | None
    ) -> AsyncGenerator[Piece, None]:
        """The one streamed load, for a miss (through the cache), a refresh and a request past
        the cache alike: one piece per upstream event, its text (or "") framed by the event's
        bytes; then ``[DONE]``; last, whether the text may be kept (``may_store``) and for how
        long. An error event is relayed and ends the stream, and nothing is kept."""
        meta = wire.StreamMeta(ex.kind, ex.body["model"])
        waited = False
        try:
            async for event, line in upstream_events(response):
                if not waited:  # the answer's headers go out after the first event
                    waited = True
                    ex.waited_upstream(time.perf_counter() - begun)
                if "error" in event:
                    yield Framed("", line)
                    yield ServeOnly()
                    return
                yield Framed(wire.delta_of(ex.kind, event, meta) or "", line)
            self.metrics.upstream_seconds.observe(time.perf_counter() - begun)
            yield Framed("", wire.DONE)
            keep = may_store(meta.finish_reason, not meta.unreplayable, ex.control, response.headers)
            yield Keep(ttl=lifetime) if keep else ServeOnly()
        finally:
            await response.aclose()

    async def storing(self, pieces: UpstreamPieces, key: RequestKey) -> AsyncGenerator[Framed[bytes], None]:
        """The pieces of a stream asked past the cache (its lookup timed out) passed on, and
        their text stored where the stream's last word says so, without a lookup (it would wait
        again on the slow embedder)."""
        parts: list[str] = []
        try:
            async for piece in pieces:
                if isinstance(piece, Keep):
                    await self.keep(key, "".join(parts), piece.ttl)
                elif isinstance(piece, Framed):
                    parts.append(piece.text)
                    yield piece
        finally:  # a client gone mid-stream closes this generator: the upstream's response too
            await pieces.aclose()

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
        self, first: Framed[bytes] | None, pieces: AsyncIterator[Framed[bytes]]
    ) -> AsyncIterator[bytes]:
        """This call's own load: the upstream's events as it sent them, each framed with its
        piece, and its end (``[DONE]``, or the error event that ended it); a cut or failed
        upstream ends it with an error event made here."""
        if first is None:
            return
        yield first.frame
        try:
            async for piece in pieces:
                yield piece.frame
        except Exception as exc:  # past the first event: an error event, never a traceback
            if not isinstance(exc, UpstreamUnavailable):  # a cut upstream is no bug to log
                log.exception("gpucache: a streamed load failed mid-stream")
            yield self.cut(exc)

    @staticmethod
    async def replay(
        meta: wire.StreamMeta, chunks: Iterable[str], include_usage: bool
    ) -> AsyncIterator[bytes]:
        """A stored answer (a hit, or another call's load), in the cache's replay chunks, as a
        stream framed as ``wire`` frames every replayed answer."""
        pieces = (wire.chunk(meta, content=piece) for piece in chunks)
        for line in itertools.chain(wire.opening(meta), pieces, wire.ending(meta, include_usage)):
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
