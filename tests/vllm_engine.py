"""Test parts for the proxy in front of a real vLLM engine (scripts/vllm_upstream.py), and a tap:
an HTTP relay between the proxy and the engine that keeps every exchange exactly as the engine
sent it, so a test can compare what a client received with what vLLM said."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import vllm_upstream  # noqa: E402

HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "host", "content-encoding"}


def engine_or_fail(**options: Any) -> vllm_upstream.Engine:
    """A started engine. The README's test command installs it, so its absence fails the test
    (a skip would let a machine without it pass); GPUCACHE_SKIP_VLLM=1 skips on purpose."""
    why = vllm_upstream.missing()
    if why is not None:
        if os.environ.get("GPUCACHE_SKIP_VLLM") == "1":
            pytest.skip(why)
        pytest.fail(why)
    return vllm_upstream.Engine(**options).start()


@dataclass
class Exchange:
    method: str
    path: str
    body: Any
    status: int = 0
    chunks: list[bytes] = field(default_factory=list)

    @property
    def raw(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return json.loads(self.raw)

    def events(self) -> list[Any]:
        """The data of each server-sent event, parsed; ``[DONE]`` kept as the string."""
        return parse_events(self.raw.decode())


def parse_events(text: str) -> list[Any]:
    events: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def make_tap(target: str) -> Starlette:
    """A relay to ``target`` (the engine's origin) that records each exchange in
    ``app.state.exchanges`` and streams the engine's bytes back unchanged."""
    client = httpx.AsyncClient(base_url=target, timeout=httpx.Timeout(300.0))

    async def relay(request: Request) -> StreamingResponse:
        body = await request.body()
        exchange = Exchange(request.method, request.url.path, json.loads(body) if body else None)
        request.app.state.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = await client.send(
            client.build_request(
                request.method, request.url.path, params=request.query_params, headers=headers, content=body
            ),
            stream=True,
        )
        exchange.status = upstream.status_code

        async def chunks():
            try:
                async for chunk in upstream.aiter_raw():
                    exchange.chunks.append(chunk)
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(
            chunks(),
            status_code=upstream.status_code,
            headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
        )

    app = Starlette(routes=[Route("/{path:path}", relay, methods=["GET", "POST"])])
    app.state.exchanges = []
    return app
