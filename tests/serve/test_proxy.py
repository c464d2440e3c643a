"""What the proxy stores of an upstream answer (gpucache/serve/proxy.py ``storable``)."""

from __future__ import annotations

import pytest

from gpucache.serve.exchange import CacheControl
from gpucache.serve.proxy import storable


class Answer:
    def __init__(self, doc, status=200, headers=None):
        self.doc, self.status_code, self.headers = doc, status, headers or {}

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


@pytest.mark.parametrize(
    "header",
    [
        "no-store",
        "private",
        "no-cache",
        "max-age=0",
        "public, s-maxage=0",
        "No-Store",
        'private="set-cookie"',
    ],
)
def test_an_answer_the_upstream_forbids_keeping_is_not_stored(header):
    plain = {"role": "assistant", "content": "Lima.", "tool_calls": [], "reasoning_content": None}
    assert storable("chat", Answer(chat(plain), headers={"cache-control": header}), CacheControl()) is None


@pytest.mark.parametrize("header", ["max-age=60", "public", "must-revalidate, max-age=3600", ""])
def test_an_answer_the_upstream_lets_caches_keep_is_stored(header):
    plain = {"role": "assistant", "content": "Lima.", "tool_calls": [], "reasoning_content": None}
    assert storable("chat", Answer(chat(plain), headers={"cache-control": header}), CacheControl()) == "Lima."
