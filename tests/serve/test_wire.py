"""The wire formats (gpucache/serve/wire.py): deltas read from upstream streams, answers and
events written back, ids."""

from __future__ import annotations

import json

from gpucache.serve import wire


def test_a_tool_call_delta_marks_the_stream_unreplayable_and_carries_no_text():
    meta = wire.StreamMeta("chat", "m")
    delta = {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}
    assert wire.delta_of("chat", {"choices": [{"delta": delta, "finish_reason": None}]}, meta) is None
    assert meta.unreplayable
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert wire.delta_of("chat", {"choices": [], "usage": usage}, meta) is None and meta.usage == usage
    wire.delta_of("chat", {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}, meta)
    assert meta.finish_reason == "tool_calls"


def test_answers_encode_to_json_that_reads_back_the_same_even_with_a_lone_surrogate():
    for text in ("plain", "naïve café, 東京", "a lone \ud800 surrogate", ""):
        doc = wire.completion("chat", "m", text)
        assert json.loads(wire.dumps(doc)) == doc
        event = json.loads(wire.sse({"choices": [{"delta": {"content": text}}]})[len(b"data: ") :])
        assert event["choices"][0]["delta"]["content"] == text


def test_answer_ids_differ_and_name_the_kind():
    ids = {wire.new_id("chat") for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("chatcmpl-gpucache-") for i in ids)
    assert wire.new_id("completions").startswith("cmpl-gpucache-")
