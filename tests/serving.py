"""Test parts for the proxy: a real uvicorn server run in a thread on 127.0.0.1, and the stand-in
upstream (tests/standin_upstream.py)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn
from standin_upstream import answer_to, make_upstream

__all__ = ["Served", "answer_to", "free_port", "keyless_proxy", "make_upstream"]


class Served:
    """An ASGI app under a real uvicorn server, in a thread, on a free 127.0.0.1 port. The
    socket is bound and listening before the thread starts, so clients may connect at once;
    their requests wait for the app's start-up. ``options`` go to ``uvicorn.Config``."""

    def __init__(self, app: Any, **options: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5, **options)
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keyless_proxy(
    upstream_url: str, embedder: Any, snapshot: str, admin_token: str, secret: bytes, **cache: Any
) -> Any:
    """The proxy app before ``upstream_url`` with the real ``embedder`` and the cache's defaults
    (but a short lookup window; ``cache`` sets others): keyless clients let in, so a module's
    clients tell themselves apart by namespace, each test a tenant of its own."""
    from gpucache import SemanticCache
    from gpucache.serve.app import create_app
    from gpucache.serve.settings import ServeSettings

    config = ServeSettings(
        upstream=upstream_url,
        admin_token=admin_token,
        require_auth=False,
        namespace_secret=secret,
        snapshot=snapshot,
    )
    return create_app(
        config,
        cache_factory=lambda: SemanticCache(
            embedder, device="cpu", lookup_window_seconds=0.002, lookup_timeout_seconds=30.0, **cache
        ),
    )
