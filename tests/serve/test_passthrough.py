"""The passthrough's allow-list: judged on the raw path, nothing outside /v1, nothing unnamed."""

from __future__ import annotations

import pytest

from gpucache.serve.passthrough import Route, route
from gpucache.serve.settings import PASSTHROUGH
from gpucache.serve.tenancy import Refusal


@pytest.mark.parametrize(
    ("method", "raw", "path", "label"),
    [
        ("GET", b"/v1/models", "models", "models"),
        ("GET", b"/v1/models/smol-135m", "models/smol-135m", "models/*"),
        ("GET", b"/v1/models/org%3Amodel", "models/org%3Amodel", "models/*"),  # quoted again on the way out
        ("POST", b"/v1/embeddings", "embeddings", "embeddings"),
        ("POST", b"/v1/moderations", "moderations", "moderations"),
    ],
)
def test_the_openai_paths_are_forwarded_under_their_rule(method, raw, path, label):
    assert route(method, raw, PASSTHROUGH) == Route(path, label)


@pytest.mark.parametrize(
    "raw",
    [
        b"/v1/../metrics",
        b"/v1/%2e%2e/metrics",
        b"/v1/%2E%2E/api/delete",
        b"/v1/..%2Fmetrics",
        b"/v1/models/..%2f..%2fmetrics",
        b"/v1/models/%5c..",
        b"/v1/models\\..",
        b"/v1/./models",
        b"/v1//models",
        b"/v1/models/",
        b"/v1/models/%00",
        b"/v1/models/a%3Fb%23c/x",
    ],
)
def test_a_step_out_of_v1_or_a_malformed_segment_is_a_400(raw):
    refused = route("GET", raw, PASSTHROUGH)
    assert isinstance(refused, Refusal) and refused.status in (400, 404), raw
    if b".." in raw.lower() or b"%2e" in raw.lower() or b"%2f" in raw.lower() or b"%5c" in raw.lower():
        assert refused.status == 400


@pytest.mark.parametrize(
    ("method", "raw"),
    [
        ("DELETE", b"/v1/models/smol"),  # a named path, another method
        ("POST", b"/v1/models"),
        ("GET", b"/v1/tokenize"),  # a model server's own endpoint
        ("POST", b"/v1/files"),
        ("GET", b"/metrics"),  # not under /v1 at all
    ],
)
def test_a_path_no_rule_names_is_a_404(method, raw):
    refused = route(method, raw, PASSTHROUGH)
    assert isinstance(refused, Refusal) and refused.status == 404


def test_the_allow_list_is_configurable():
    rules = ("POST tokenize",)
    assert route("POST", b"/v1/tokenize", rules) == Route("tokenize", "tokenize")
    assert isinstance(route("GET", b"/v1/models", rules), Refusal)
