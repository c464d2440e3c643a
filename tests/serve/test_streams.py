"""Upstream events (gpucache/serve/streams.py): read up to [DONE], relayed as sent, a cut
connection an unavailable upstream."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gpucache.serve.streams import upstream_events
from gpucache.serve.upstream import UpstreamUnavailable


class Lines:
    """An upstream response's lines, then (optionally) a cut connection."""

    def __init__(self, lines, cut=False):
        self.lines, self.cut = lines, cut

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
    got = read_events(Lines([": keep-alive", f"data: {json.dumps(first)}", "", "data: not json",
                             f"data:{json.dumps(error)}", "data: [DONE]", 'data: {"after": 1}']))
    assert [event for event, _ in got] == [first, error]
    assert got[0][1] == f"data: {json.dumps(first)}\n\n".encode()


def test_a_cut_connection_is_an_unavailable_upstream_never_a_transport_traceback():
    with pytest.raises(UpstreamUnavailable) as raised:
        read_events(Lines(['data: {"choices": []}'], cut=True))
    assert raised.value.status == 502
