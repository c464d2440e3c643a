"""The proxy's parts, in process: Cache-Control as HTTP means it, what may be stored, the wire
formats it reads (tool-call deltas, error events, usage chunks, [DONE]), and bodies it refuses."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gpucache.cache.lookup import Hit
from gpucache.serve import wire
from gpucache.serve.exchange import MAX_DELTA_SECONDS, CacheControl
from gpucache.serve.keying import MAX_JSON_DEPTH, BadRequest, parse_json
from gpucache.serve.proxy import storable
from gpucache.serve.streams import upstream_events
from gpucache.serve.tenancy import Refusal
from gpucache.serve.upstream import UpstreamUnavailable


def hit(age: float) -> Hit:
    return Hit("an answer", "a prompt", 1.0, exact=True, age=age)


# ------------------------------------------------------------------------- Cache-Control


def test_max_age_is_the_age_a_request_accepts_not_a_lifetime():
    control = CacheControl.parse("max-age=60")
    assert control == CacheControl(max_age=60) and control.reads and not control.no_store
    assert control.fresh(hit(59.5)) and control.fresh(hit(60)) and not control.fresh(hit(60.5))
    assert not control.fresh(hit(float("inf")))  # an answer of unknown age is never fresh
    assert CacheControl().fresh(hit(float("inf")))  # no max-age: any age


def test_no_cache_and_max_age_zero_read_nothing_and_no_store_stores_nothing():
    assert not CacheControl.parse("no-cache").reads
    assert not CacheControl.parse("max-age=0").reads
    both = CacheControl.parse("No-Store, no-cache")
    assert both.no_store and not both.reads


def test_a_huge_max_age_is_capped_as_rfc_9111_says_and_a_malformed_one_is_a_400():
    assert CacheControl.parse("max-age=10000000000000000").max_age == MAX_DELTA_SECONDS
    assert CacheControl.parse("max-age=" + "9" * 10_000).max_age == MAX_DELTA_SECONDS  # past int()'s digits
    assert CacheControl.parse("max-age=" + "0" * 5_000 + "7").max_age == 7  # leading zeros are zeros
    for bad in ("max-age=-1", "max-age=1.5", 'max-age="5"', "max-age=", "max-age=١٢"):
        refused = CacheControl.parse(bad)
        assert isinstance(refused, Refusal) and refused.status == 400, bad
    assert CacheControl.parse("private, must-revalidate") == CacheControl()  # unknown: ignored


# ------------------------------------------------------------------------- what is stored


class Answer:
    def __init__(self, doc, status=200):
        self.doc, self.status_code = doc, status

    def json(self):
        if isinstance(self.doc, Exception):
            raise self.doc
        return self.doc


def chat(message, finish="stop"):
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def test_only_a_complete_answer_its_text_replays_is_stored():
    plain = {"role": "assistant", "content": "Lima.", "tool_calls": [], "reasoning_content": None}
    assert storable("chat", Answer(chat(plain)), CacheControl()) == "Lima."
    assert storable("chat", Answer(chat(plain)), CacheControl(no_store=True)) is None
    assert storable("chat", Answer(chat(plain), status=500), CacheControl()) is None
    assert storable("chat", Answer(chat(plain, finish="length")), CacheControl()) is None
    assert storable("chat", Answer(ValueError("not JSON")), CacheControl()) is None
    for more in ({"tool_calls": [{"id": "c"}]}, {"refusal": "I can't."}, {"reasoning_content": "hmm"}):
        assert storable("chat", Answer(chat({**plain, **more})), CacheControl()) is None, more


# ------------------------------------------------------------------------- the wire


def test_a_tool_call_delta_marks_the_stream_unreplayable_and_carries_no_text():
    meta = wire.StreamMeta("chat", "m")
    delta = {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}
    assert wire.delta_of("chat", {"choices": [{"delta": delta, "finish_reason": None}]}, meta) is None
    assert meta.unreplayable
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert wire.delta_of("chat", {"choices": [], "usage": usage}, meta) is None and meta.usage == usage
    wire.delta_of("chat", {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}, meta)
    assert meta.finish_reason == "tool_calls"


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


# ------------------------------------------------------------------------- bodies


def test_nesting_past_the_limit_is_a_bad_request_at_any_depth():
    ok = json.dumps({"model": "m", "x": [[[]]]}).encode()
    assert parse_json(ok)["model"] == "m"
    just = ("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH).encode()
    parse_json(just)
    for depth in (MAX_JSON_DEPTH + 1, 100_000):
        with pytest.raises(BadRequest, match="nests deeper"):
            parse_json(("[" * depth + "]" * depth).encode())
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_json(b"{not json")


# --------------------------------------------------------------------------- wire


def test_answers_encode_to_json_that_reads_back_the_same_even_with_a_lone_surrogate():
    for text in ("plain", "naïve café, 東京", "a lone \ud800 surrogate", ""):
        doc = wire.completion("chat", "m", text)
        assert json.loads(wire.dumps(doc)) == doc
        event = json.loads(wire.sse({"choices": [{"delta": {"content": text}}]})[len(b"data: "):])
        assert event["choices"][0]["delta"]["content"] == text


def test_answer_ids_differ_and_name_the_kind():
    ids = {wire.new_id("chat") for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("chatcmpl-gpucache-") for i in ids)
    assert wire.new_id("completions").startswith("cmpl-gpucache-")
