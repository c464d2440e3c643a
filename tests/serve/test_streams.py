"""Upstream events (gpucache/serve/streams.py): read up to [DONE], relayed as sent, a cut
connection an unavailable upstream."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from exchanges import exchange

from gpucache.cache.served import Framed, Keep, ServeOnly
from gpucache.serve import wire
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.streams import Streams, upstream_events
from gpucache.serve.upstream import UpstreamUnavailable


class Lines:
    """An upstream response's lines, then (optionally) a cut connection."""

    def __init__(self, lines, cut=False):
        self.lines, self.cut = lines, cut
        self.headers, self.closed = {}, False

    async def aclose(self):
        self.closed = True

    async def aiter_lines(self):
        for line in self.lines:
            yield line
        if self.cut:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def read_events(response):
    async def collect():
        return [pair async for pair in upstream_events(response)]

    return asyncio.run(collect())


def test_events_are_read_up_to_done_and_relayed_as_sent():
    first = {"choices": [{"delta": {"content": "Hi"}}]}
    error = {"error": {"message": "out of memory", "type": "server_error"}}
    got = read_events(
        Lines(
            [
                ": keep-alive",
                f"data: {json.dumps(first)}",
                "",
                "data: not json",
                f"data:{json.dumps(error)}",
                "data: [DONE]",
                'data: {"after": 1}',
            ]
        )
    )
    assert [event for event, _ in got] == [first, error]
    assert got[0][1] == f"data: {json.dumps(first)}\n\n".encode()


def test_a_cut_connection_is_an_unavailable_upstream_never_a_transport_traceback():
    with pytest.raises(UpstreamUnavailable) as raised:
        read_events(Lines(['data: {"choices": []}'], cut=True))
    assert raised.value.status == 502


def load_pieces(lines):
    """``Streams.pieces`` over an upstream answering ``lines``: what the cache is handed."""
    ex = exchange()
    response = Lines(lines)

    async def collect():
        return [piece async for piece in Streams(ProxyMetrics(), keep=None).pieces(response, ex, 0.0, None)]

    pieces = asyncio.run(collect())
    assert response.closed
    return pieces


def delta(text, finish=None):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def test_each_event_travels_as_one_piece_its_text_for_the_cache_framed_by_its_bytes_for_the_client():
    events = [delta("Hi"), {"choices": []}, delta(" there", "stop")]
    pieces = load_pieces([f"data: {json.dumps(e)}" for e in events] + ["data: [DONE]"])
    assert pieces[:-1] == [
        Framed("Hi", f"data: {json.dumps(events[0])}\n\n".encode()),
        Framed("", f"data: {json.dumps(events[1])}\n\n".encode()),
        Framed(" there", f"data: {json.dumps(events[2])}\n\n".encode()),
        Framed("", wire.DONE),
    ]
    assert pieces[-1] == Keep(ttl=None)


def test_an_error_event_is_the_streams_last_frame_and_nothing_of_it_is_kept():
    error = {"error": {"message": "out of memory", "type": "server_error"}}
    pieces = load_pieces([f"data: {json.dumps(delta('Hi'))}", f"data: {json.dumps(error)}", "data: [DONE]"])
    assert [p.frame for p in pieces[:-1]][1:] == [f"data: {json.dumps(error)}\n\n".encode()]
    assert pieces[-1] == ServeOnly()
