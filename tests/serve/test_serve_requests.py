"""Requests that cannot be ambiguous, and the upstream's word on storing, end to end: a real
uvicorn server driven by the official ``openai`` client (and httpx where a request must carry
what no well-behaved client sends), in front of the stand-in upstream.

- A credential or namespace header sent twice is a 400 that reaches nothing: the proxy would
  hash one value and the upstream check another.
- The raw query string is part of the scope and reaches the upstream as it was sent; a
  credential in it names the tenant as a header does.
- An answer the upstream marks ``no-store`` is neither stored nor served later, JSON or stream.
"""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serving import Served, make_upstream  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402

SECRET = b"tenancy-secret-for-request-tests"


@pytest.fixture(scope="module")
def upstream():
    with Served(make_upstream()) as served:
        yield served


@pytest.fixture(scope="module")
def proxy(upstream, real_embedder):
    config = ServeSettings(upstream=f"{upstream.url}/v1", namespace_secret=SECRET)
    app = create_app(config, cache_factory=lambda: SemanticCache(real_embedder, device="cpu",
                                                                  lookup_timeout_seconds=30.0))
    with Served(app) as served:
        yield served


def ask(proxy, text, headers, query=""):
    body = {"model": "smol", "messages": [{"role": "user", "content": text}]}
    url = f"{proxy.url}/v1/chat/completions" + (f"?{query}" if query else "")
    return httpx.post(url, json=body, headers=headers, timeout=60)


def calls_of(upstream, text):
    return sum(1 for _, t in upstream.app.state.calls if t == text)


@pytest.mark.parametrize("name", ["authorization", "x-api-key", "x-gpucache-namespace"])
def test_a_credential_or_namespace_header_sent_twice_is_refused_and_reaches_nothing(proxy, upstream, name):
    text = f"Which header did I send twice? {name}"
    value = "Bearer sk-one" if name == "authorization" else "one"
    other = "Bearer sk-two" if name == "authorization" else "two"
    headers = [("content-type", "application/json"), (name, value), (name, other)]
    if name != "authorization":
        headers.append(("authorization", "Bearer sk-one"))
    response = ask(proxy, text, headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "duplicate_header"
    assert calls_of(upstream, text) == 0


def test_an_empty_first_credential_does_not_file_into_the_keyless_tenant(proxy, upstream):
    text = "Where do empty credentials go?"
    keyless = ask(proxy, text, {})  # refused by default: keyless clients are an opt-in
    assert keyless.status_code == 401 and keyless.json()["error"]["code"] == "missing_credentials"
    doubled = ask(proxy, text, [("authorization", ""), ("authorization", "Bearer sk-victim")])
    assert doubled.status_code == 400 and calls_of(upstream, text) == 0


def test_the_query_string_splits_the_scope_and_reaches_the_upstream_as_sent(proxy, upstream):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-azure", max_retries=0)
    text = "Summarise the release notes of version nine"
    first = c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}], extra_query={"api-version": "2024-06-01"})
    again = c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}], extra_query={"api-version": "2024-06-01"})
    other = c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}], extra_query={"api-version": "2025-01-01"})
    assert [r.headers["x-gpucache"] for r in (first, again, other)] == ["miss", "exact", "miss"]
    assert calls_of(upstream, text) == 2
    # a repeated parameter reaches the upstream as the client wrote it, not merged
    assert ask(proxy, "Repeat my parameters", {"authorization": "Bearer sk-q"}, "a=1&a=2").status_code == 200
    assert upstream.app.state.queries[-1] == "a=1&a=2"


def test_a_credential_in_the_query_string_names_its_tenant(proxy, upstream):
    text = "Which project is this key for?"
    assert ask(proxy, text, {}, "key=alice-key").headers["x-gpucache"] == "miss"
    assert ask(proxy, text, {}, "key=bob-key").headers["x-gpucache"] == "miss"  # another tenant
    assert ask(proxy, text, {}, "key=alice-key").headers["x-gpucache"] == "exact"
    assert ask(proxy, text, {}, "key=alice-key&key=bob-key").status_code == 400
    assert calls_of(upstream, text) == 2


def test_an_answer_the_upstream_marks_no_store_is_never_kept(proxy, upstream):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-nostore", max_retries=0)
    text = "[no-store] What is my account balance?"
    for _ in range(2):
        got = c.chat.completions.with_raw_response.create(
            model="smol", messages=[{"role": "user", "content": text}])
        assert got.headers["x-gpucache"] == "miss"
    assert calls_of(upstream, text) == 2


def test_a_streamed_answer_the_upstream_marks_no_store_is_never_kept(proxy, upstream):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-nostore-stream", max_retries=0)
    text = "[no-store] List my recent transactions"
    for _ in range(2):
        with c.chat.completions.with_streaming_response.create(
                model="smol", messages=[{"role": "user", "content": text}], stream=True) as got:
            assert got.headers["x-gpucache"] == "miss"
            assert "".join(got.iter_lines())
    assert calls_of(upstream, text) == 2
