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

import json

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
    app = create_app(
        config, cache_factory=lambda: SemanticCache(real_embedder, device="cpu", lookup_timeout_seconds=30.0)
    )
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
        model="smol", messages=[{"role": "user", "content": text}], extra_query={"api-version": "2024-06-01"}
    )
    again = c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}], extra_query={"api-version": "2024-06-01"}
    )
    other = c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}], extra_query={"api-version": "2025-01-01"}
    )
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
            model="smol", messages=[{"role": "user", "content": text}]
        )
        assert got.headers["x-gpucache"] == "miss"
    assert calls_of(upstream, text) == 2


def test_a_streamed_answer_the_upstream_marks_no_store_is_never_kept(proxy, upstream):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-nostore-stream", max_retries=0)
    text = "[no-store] List my recent transactions"
    for _ in range(2):
        with c.chat.completions.with_streaming_response.create(
            model="smol", messages=[{"role": "user", "content": text}], stream=True
        ) as got:
            assert got.headers["x-gpucache"] == "miss"
            assert "".join(got.iter_lines())
    assert calls_of(upstream, text) == 2


def lifetime_proxy(upstream, real_embedder, clock, ttl=None):
    config = ServeSettings(upstream=f"{upstream.url}/v1", namespace_secret=SECRET)
    return Served(
        create_app(
            config,
            cache_factory=lambda: SemanticCache(
                real_embedder, device="cpu", lookup_timeout_seconds=30.0, timer=lambda: clock[0], ttl=ttl
            ),
        )
    )


def tiers(proxy, text, stream):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-lifetime", max_retries=0)
    messages = [{"role": "user", "content": text}]
    if stream:
        with c.chat.completions.with_streaming_response.create(
            model="smol", messages=messages, stream=True
        ) as r:
            list(r.iter_lines())
            return r.headers["x-gpucache"]
    return c.chat.completions.with_raw_response.create(model="smol", messages=messages).headers["x-gpucache"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_upstreams_max_age_caps_how_long_an_answer_lives(upstream, real_embedder, stream):
    clock = [1_000.0]
    with lifetime_proxy(upstream, real_embedder, clock) as proxy:
        text = f"What is today's exchange rate? [max-age=30] stream={stream}"
        assert [tiers(proxy, text, stream) for _ in range(2)] == ["miss", "exact"]
        clock[0] += 29
        assert tiers(proxy, text, stream) == "exact"
        clock[0] += 2  # 31 s after it was stored: past the upstream's 30
        assert tiers(proxy, text, stream) == "miss"


@pytest.mark.parametrize("stream", [False, True])
def test_a_lifetime_past_ten_years_keeps_the_answer_ten_years(upstream, real_embedder, stream):
    """HTTP allows a max-age up to 2^31 s; an entry lives ten years at most. A streamed answer
    whose upstream said more used to end in an error event after its last word, kept nowhere."""
    clock = [1_000.0]
    with lifetime_proxy(upstream, real_embedder, clock) as proxy:
        text = f"What is the speed of light in a vacuum? [max-age=999999999999] stream={stream}"
        assert [tiers(proxy, text, stream) for _ in range(2)] == ["miss", "exact"]
        clock[0] += 10 * 365 * 86400 - 1
        assert tiers(proxy, text, stream) == "exact"
        clock[0] += 2
        assert tiers(proxy, text, stream) == "miss"


def test_the_caches_ttl_stands_where_it_is_shorter_than_the_upstreams(upstream, real_embedder):
    clock = [1_000.0]
    with lifetime_proxy(upstream, real_embedder, clock, ttl=10) as proxy:
        text = "What is the weather like this hour? [max-age=30]"
        assert [tiers(proxy, text, False) for _ in range(2)] == ["miss", "exact"]
        clock[0] += 11
        assert tiers(proxy, text, False) == "miss"


@pytest.mark.parametrize("stream", [False, True])
def test_a_miss_keeps_the_upstreams_response_headers_json_or_stream(proxy, stream):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-headers", max_retries=0)
    messages = [{"role": "user", "content": f"How many requests may I still send? stream={stream}"}]
    if stream:
        with c.chat.completions.with_streaming_response.create(
            model="smol", messages=messages, stream=True
        ) as r:
            list(r.iter_lines())
            headers = r.headers
    else:
        headers = c.chat.completions.with_raw_response.create(model="smol", messages=messages).headers
    assert headers["x-gpucache"] == "miss" and headers["x-ratelimit-remaining-requests"] == "99"
    # the proxy's server dates every answer: the upstream's own Date and Server are not sent again
    assert len(headers.get_list("date")) == 1 and len(headers.get_list("server")) <= 1


# ----------------------------------------------------------------------------- what cannot be sent on

LONE = "\\ud800"  # a JSON escape for half a surrogate pair: valid JSON, not text
KEY = {"authorization": "Bearer sk-text", "content-type": "application/json"}


@pytest.mark.parametrize(
    "field", ["stop", "model", "tool", "metadata", "unknown", "system", "suffix", "prompt"]
)
def test_a_lone_surrogate_anywhere_in_the_body_is_a_400_that_reaches_nothing(proxy, upstream, field):
    text = f"Where can a lone surrogate hide? {field}"
    before = len(upstream.app.state.calls)
    messages = [{"role": "user", "content": text}]
    body = {"model": "smol", "messages": messages}
    path = "chat/completions"
    if field in ("stop", "metadata", "unknown"):
        body[{"unknown": "x_vendor_field"}.get(field, field)] = (
            "MARK" if field != "metadata" else {"k": "MARK"}
        )
    elif field == "model":
        body["model"] = "smol-MARK"
    elif field == "tool":
        body["tools"] = [{"type": "function", "function": {"name": "look_MARK", "parameters": {}}}]
    elif field == "system":
        messages.insert(0, {"role": "system", "content": "Be brief MARK"})
    else:  # the completions endpoint's prompt and suffix
        path, body = "completions", {"model": "smol", "prompt": text + (" MARK" if field == "prompt" else "")}
        if field == "suffix":
            body["suffix"] = "MARK"
    import json

    raw = json.dumps(body).replace("MARK", LONE).encode()
    r = httpx.post(f"{proxy.url}/v1/{path}", content=raw, headers=KEY)
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"]
    assert len(upstream.app.state.calls) == before


@pytest.mark.parametrize("path", ["chat/completions", "embeddings"])
def test_a_header_value_that_is_not_ascii_is_a_400_not_an_upstream_failure(proxy, upstream, path):
    before = len(upstream.app.state.calls)
    body = {"model": "smol", "messages": [{"role": "user", "content": "Say hello in French"}], "input": "x"}
    r = httpx.post(
        f"{proxy.url}/v1/{path}",
        json=body,
        headers={"authorization": "Bearer sk-text", "x-note": "caf\xe9".encode("latin-1")},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_header"
    assert len(upstream.app.state.calls) == before


@pytest.mark.parametrize("logprobs", [0, 1, True])
def test_a_completion_asking_for_logprobs_of_any_count_bypasses_the_cache(proxy, upstream, logprobs):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-logprobs", max_retries=0)
    prompt = f"Count the logprobs of this prompt ({logprobs!r})"
    plain = c.completions.with_raw_response.create(model="smol", prompt=prompt)
    asked = [
        c.completions.with_raw_response.create(model="smol", prompt=prompt, logprobs=logprobs)
        for _ in range(2)
    ]
    assert plain.headers["x-gpucache"] == "miss"
    assert [r.headers["x-gpucache"] for r in asked] == ["bypass", "bypass"]


def test_a_namespace_secret_shorter_than_16_bytes_is_refused_at_start():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ServeSettings(upstream="http://127.0.0.1:9/v1", namespace_secret=b"short")


def test_a_chat_request_past_openais_bound_of_messages_is_a_400_and_reaches_nothing(proxy, upstream):
    from gpucache.serve.keying import MAX_MESSAGES

    before = len(upstream.app.state.calls)
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-many", max_retries=0)
    turn = [{"role": "user", "content": "Which port does it use?"}, {"role": "assistant", "content": "8080"}]
    messages = [turn[i % 2] for i in range(MAX_MESSAGES + 1)]  # ends with a question
    with pytest.raises(openai.BadRequestError) as refused:
        c.chat.completions.create(model="smol", messages=messages)
    assert refused.value.body["param"] == "messages" and "at most 2048" in refused.value.body["message"]
    assert len(upstream.app.state.calls) == before


def test_a_message_of_more_content_parts_than_the_bound_is_forwarded_and_never_stored(proxy, upstream):
    from gpucache.serve.keying import MAX_CONTENT_PARTS

    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-parts", max_retries=0)
    content = [{"type": "text", "text": "Which port does the proxy listen on?"}] * (MAX_CONTENT_PARTS + 1)
    asked = [
        c.chat.completions.with_raw_response.create(
            model="smol", messages=[{"role": "user", "content": content}]
        )
        for _ in range(2)
    ]
    assert [r.headers["x-gpucache"] for r in asked] == ["bypass", "bypass"]  # the second not served
    assert (
        'gpucache_bypasses_total{reason="many-content-parts"} 2.0' in httpx.get(f"{proxy.url}/metrics").text
    )


def test_a_conversation_longer_than_anything_stored_is_forwarded_and_counted_as_too_large(proxy, upstream):
    """Its earlier turns past what the cache stores: answered by the upstream both times,
    counted as a bypass, and never looked up (the lookup's work on a body near the size cap
    held every other tenant's hits)."""
    from gpucache.serve.keying import MAX_COMPARED_CHARS

    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-long-history", max_retries=0)
    messages = [
        {"role": "user", "content": "lorem ipsum dolor " * (MAX_COMPARED_CHARS // 18 + 1)},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "Summarise the text I sent, please"},
    ]
    before = len(upstream.app.state.calls)
    asked = [c.chat.completions.with_raw_response.create(model="smol", messages=messages) for _ in range(2)]
    assert [r.headers["x-gpucache"] for r in asked] == ["bypass", "bypass"]
    assert len(upstream.app.state.calls) == before + 2
    assert 'gpucache_bypasses_total{reason="too-large"} 2.0' in httpx.get(f"{proxy.url}/metrics").text


@pytest.mark.parametrize("stream", [False, True])
def test_a_body_of_more_values_than_the_bound_is_forwarded_unparsed_and_never_stored(proxy, upstream, stream):
    """A body that may hold more JSON values than ``MAX_JSON_VALUES`` (counted before any parse)
    is forwarded as it came and its answer relayed, JSON or stream, never parsed, keyed or
    stored by the proxy: bodies of hundreds of thousands of small values held the GIL in the
    parse and the key's walk, and stalled every other tenant's hits."""
    from gpucache.serve.keying import MAX_JSON_VALUES

    body = {
        "model": "smol",
        "messages": [{"role": "user", "content": f"Which values arrive in this body? (stream={stream})"}],
        "stream": stream,
        "metadata_values": list(range(MAX_JSON_VALUES)),
    }
    raw = json.dumps(body).encode()
    before = len(upstream.app.state.calls)
    asked = [
        httpx.post(
            f"{proxy.url}/v1/chat/completions",
            content=raw,
            headers={"authorization": "Bearer sk-many-values", "content-type": "application/json"},
            timeout=60,
        )
        for _ in range(2)
    ]
    assert [r.status_code for r in asked] == [200, 200]
    assert [r.headers["x-gpucache"] for r in asked] == ["bypass", "bypass"]  # the second not served
    assert len(upstream.app.state.calls) == before + 2
    if stream:
        assert asked[0].headers["content-type"].startswith("text/event-stream")
        assert asked[0].text.rstrip().endswith("data: [DONE]")
    else:
        assert asked[0].json()["choices"][0]["message"]["content"]
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert 'gpucache_bypasses_total{reason="many-values"}' in metrics
