"""The upstream model server, through one pooled ``httpx.AsyncClient``.

Errors are sorted here so the proxy can answer each the way OpenAI clients expect: an upstream
that cannot be reached is a 502, one that takes too long a 504 (``UpstreamUnavailable``); an
upstream's own error status is an answer like any other, passed through unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from gpucache.extras import missing

try:
    import httpx
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc

log = logging.getLogger("gpucache.serve")

# Request headers that belong to one hop, or that the proxy sets itself
HOP_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
        "cache-control",
    }
)
# Response headers not passed back: httpx has already decoded and de-chunked the body; and the
# server's own Date and Server, which the proxy's server sends for every answer (passed on,
# each would go out twice)
RESPONSE_HOP_HEADERS = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "connection", "date", "server"}
)


class UpstreamUnavailable(Exception):
    """The upstream could not be reached (502) or did not answer in time (504)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@contextmanager
def calling_upstream(waited: Callable[[float], None], what: str) -> Iterator[None]:
    """A call to the upstream: its wait handed to ``waited`` (an exchange counts it as the
    upstream's), and an error of any kind turned into ``UpstreamUnavailable`` (a 502), so the
    cache sees the loader's errors as one kind and a broken call never fails open into a second
    upstream request."""
    begun = time.perf_counter()
    try:
        yield
    except UpstreamUnavailable:
        raise
    except Exception as exc:
        log.exception("gpucache: %s failed", what)
        raise UpstreamUnavailable(502, f"{what} failed: {type(exc).__name__}") from exc
    finally:
        waited(time.perf_counter() - begun)


def forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in headers.items()
        if k.lower() not in HOP_HEADERS and not k.lower().startswith("x-gpucache")
    }


def returned(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in RESPONSE_HOP_HEADERS}


class Upstream:
    def __init__(
        self, base_url: str, timeout: float, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        """``transport``, where given, carries every request in place of the network (the proxy's
        unit tests answer with ``httpx.MockTransport``)."""
        self.base_url = base_url.rstrip("/")
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
            transport=transport,
        )

    def url(self, path: str, query: str = "") -> str:
        """``path`` below ``/v1`` on the proxy, on the upstream's base URL (which ends in /v1),
        with the client's raw query string as it was received (re-encoding parameters would
        merge "a=1&a=2" or change what the upstream authenticates)."""
        url = f"{self.base_url}/{path.lstrip('/')}"
        return f"{url}?{query}" if query else url

    async def send(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        params: str = "",
        timeout: float | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """A whole response (read), or ``UpstreamUnavailable``; ``timeout``, where given, in place
        of the client's (a credential check's own, shorter one); ``stream``: its body still to be
        read, the caller closes it (``open``)."""
        try:
            request = self.client.build_request(
                method,
                self.url(path, params),
                headers=forwarded(headers),
                content=body,
                timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
            )
            return await self.client.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            raise UpstreamUnavailable(504, f"the upstream did not answer in time ({exc!r})") from exc
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(502, f"the upstream could not be reached ({exc!r})") from exc

    async def open(
        self, path: str, headers: Mapping[str, str], body: bytes, params: str = ""
    ) -> httpx.Response:
        """A streamed POST whose body is still to be read; the caller closes it."""
        return await self.send("POST", path, headers, body, params, stream=True)

    async def reachable(self, timeout: float = 2.0) -> bool:
        try:
            response = await self.client.get(self.url("models"), timeout=timeout)
        except httpx.HTTPError:
            return False
        return response.status_code < 500

    async def close(self) -> None:
        await self.client.aclose()
