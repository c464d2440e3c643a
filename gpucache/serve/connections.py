"""Connections the server will not keep waiting for: a request's headers must arrive within
``header_timeout`` seconds of the connection opening or of the request's first byte.

Why: uvicorn has no deadline on receiving a request. Its keep-alive timeout covers only the
idle time between requests and is reset by every byte received, so a client that trickles a
request head one byte at a time, or opens connections and sends nothing, holds each connection
(a socket, a parser, a task) for as long as it likes; a few hundred such clients exhaust the
server's descriptors while costing the attacker nothing (the slowloris attack). An ASGI app
cannot help: it is called only once the headers are complete. So the deadline lives in the HTTP
protocol itself: ``HttpToolsProtocol`` (the parser the serve extra installs) with a timer armed
when the connection opens and when a request begins, disarmed when its headers are complete. A
body, a long generation and a stream are never cut by it; a connection idle between requests is
uvicorn's keep-alive timeout's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gpucache.extras import missing

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc


log = logging.getLogger("gpucache.serve")


class HeaderDeadline(HttpToolsProtocol):
    """``HttpToolsProtocol`` that closes a connection whose request headers are not complete
    within ``header_timeout`` seconds; ``closed_slow`` counts them (every instance, for tests
    and logs)."""

    header_timeout = 10.0
    closed_slow = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        type(self).closed_slow += 1
        log.info("gpucache: closed a connection whose request headers took over %.0f s", self.header_timeout)
        self.transport.close()


def header_deadline(seconds: float) -> type[HeaderDeadline]:
    """The protocol class for uvicorn's ``http=`` with a deadline of ``seconds``."""
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout": seconds, "closed_slow": 0})
