"""Request bodies (gpucache/serve/keying.py): JSON refused past a nesting limit."""

from __future__ import annotations

import json

import pytest

from gpucache.serve.keying import MAX_JSON_DEPTH, BadRequest, parse_json


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
