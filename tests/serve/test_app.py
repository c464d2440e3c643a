"""The proxy's branches without a server: the app in this process (Starlette's ``TestClient``
runs its start and stop), its upstream an ``httpx.MockTransport`` that answers as an
OpenAI-compatible model server would and records what it was asked (``create_app``'s
``upstream_transport``). The real server, the official client and real upstreams test the same
paths end to end (test_serve*.py, test_vllm.py); these pin each branch, fast, and say which
requests reached the upstream."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from conftest import FakeEmbedder  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402

GOOD, BAD = "Bearer sk-good", "Bearer sk-revoked"


class ModelServer:
    """An upstream in a function: a key other than ``GOOD`` gets a 401 (so it is the authority
    on keys), ``/v1/models`` lists one model, and a completion answers "answer to <prompt>",
    whole or as server-sent events. ``then`` holds what the next completions get instead (a
    status, an exception to raise, or a finish reason), one per request."""

    def __init__(self) -> None:
        self.completions: list[str] = []  # the prompts asked
        self.checks = 0  # credential checks (GET /v1/models with a key it issued)
        self.then: list[int | str | Exception] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != GOOD:
            return httpx.Response(
                401,
                json={
                    "error": {
                        "message": "invalid key",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
            )
        if request.url.path == "/v1/models":
            self.checks += 1
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
        body = json.loads(request.content)
        prompt = body["messages"][-1]["content"]
        self.completions.append(prompt)
        instead = self.then.pop(0) if self.then else "stop"
        if isinstance(instead, Exception):
            raise instead
        text = f"answer to {prompt}"
        if isinstance(instead, int):  # an error status whose body still reads as an answer
            return httpx.Response(
                instead,
                json={
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": text},
                        }
                    ],
                    "error": {"message": "upstream trouble"},
                },
            )
        if body.get("stream"):
            events = [
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": text[:6]},
                            "finish_reason": None,
                        }
                    ]
                },
                {"choices": [{"index": 0, "delta": {"content": text[6:]}, "finish_reason": instead}]},
            ]
            sse = (
                "".join(
                    f"data: {json.dumps({'id': 'c1', 'object': 'chat.completion.chunk', 'model': 'm', **e})}\n\n"
                    for e in events
                )
                + "data: [DONE]\n\n"
            )
            return httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})
        return httpx.Response(
            200,
            json={
                "id": "c1",
                "object": "chat.completion",
                "model": "m",
                "created": 0,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": instead}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
            },
        )


@pytest.fixture
def upstream() -> ModelServer:
    return ModelServer()


@pytest.fixture
def proxy(upstream):
    config = ServeSettings(
        upstream="http://model-server.invalid/v1", namespace_secret=b"a-secret-for-these-tests"
    )
    app = create_app(
        config,
        cache_factory=lambda: SemanticCache(FakeEmbedder(), device="cpu"),
        upstream_transport=httpx.MockTransport(upstream),
    )
    with TestClient(app) as client:
        yield client


def ask(proxy, prompt: str, key: str = GOOD, stream: bool = False, **headers: str):
    return proxy.post(
        "/v1/chat/completions",
        headers={"authorization": key, **headers},
        json={"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": stream},
    )


def test_a_miss_is_asked_of_the_upstream_once_and_its_repeat_answered_from_the_cache(proxy, upstream):
    first, again = (
        ask(proxy, "What is the boiling point of water?"),
        ask(proxy, "What is the boiling point of water?"),
    )
    assert (first.status_code, first.headers["x-gpucache"]) == (200, "miss")
    assert (again.status_code, again.headers["x-gpucache"]) == (200, "exact")
    assert again.json()["choices"][0]["message"]["content"] == "answer to What is the boiling point of water?"
    assert upstream.completions == ["What is the boiling point of water?"]


def test_a_key_the_upstream_refuses_gets_its_refusal_and_nothing_from_the_cache(proxy, upstream):
    assert ask(proxy, "Name the largest moon of Saturn").status_code == 200
    refused = ask(proxy, "Name the largest moon of Saturn", key=BAD)
    assert refused.status_code == 401
    assert "answer to" not in refused.text and refused.headers.get("x-gpucache") != "exact"
    assert upstream.completions == ["Name the largest moon of Saturn"]


def test_a_request_without_a_key_is_refused_before_the_cache(proxy, upstream):
    assert ask(proxy, "Name the largest moon of Saturn").status_code == 200
    keyless = proxy.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "Name the largest moon of Saturn"}]},
    )
    assert keyless.status_code == 401 and "answer to" not in keyless.text


@pytest.mark.parametrize("trouble", [500, 429, "length"])
def test_an_upstream_error_or_a_cut_answer_is_passed_on_and_never_stored(proxy, upstream, trouble):
    upstream.then = [trouble]
    first = ask(proxy, "Summarise the plot of Hamlet")
    assert first.status_code == (trouble if isinstance(trouble, int) else 200)
    again = ask(proxy, "Summarise the plot of Hamlet")
    assert (again.status_code, again.headers["x-gpucache"]) == (200, "miss")
    assert upstream.completions == ["Summarise the plot of Hamlet"] * 2


@pytest.mark.parametrize(
    "failure, status", [(httpx.ConnectError("refused"), 502), (httpx.ReadTimeout("slow"), 504)]
)
def test_an_upstream_that_cannot_answer_is_a_clear_error_and_stores_nothing(proxy, upstream, failure, status):
    upstream.then = [failure]
    failed = ask(proxy, "How tall is Mount Kilimanjaro?")
    assert failed.status_code == status
    assert failed.json()["error"]["message"]
    assert ask(proxy, "How tall is Mount Kilimanjaro?").headers["x-gpucache"] == "miss"


def test_a_client_asking_no_cache_is_answered_afresh_and_the_entry_refreshed(proxy, upstream):
    assert ask(proxy, "Who painted the Night Watch?").status_code == 200
    fresh = ask(proxy, "Who painted the Night Watch?", **{"cache-control": "no-cache"})
    assert fresh.headers["x-gpucache"] == "miss"
    assert ask(proxy, "Who painted the Night Watch?").headers["x-gpucache"] == "exact"
    assert upstream.completions == ["Who painted the Night Watch?"] * 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_no_cache_answer_is_stored_as_a_misss_is_admission_included(upstream, stream):
    """A refresh is a load that is served nothing stored, not a store past the cache's rules:
    under an admission policy a prompt seen once is not kept, refreshed or not."""
    from gpucache import AdmissionPolicy

    config = ServeSettings(
        upstream="http://model-server.invalid/v1", namespace_secret=b"a-secret-for-these-tests"
    )
    app = create_app(
        config,
        cache_factory=lambda: SemanticCache(
            FakeEmbedder(), device="cpu", admission=AdmissionPolicy(min_sightings=2)
        ),
        upstream_transport=httpx.MockTransport(upstream),
    )
    with TestClient(app) as proxy:
        prompt = "Who composed the Goldberg Variations?"
        fresh = ask(proxy, prompt, stream=stream, **{"cache-control": "no-cache"})
        assert fresh.status_code == 200 and "Goldberg" in fresh.text
        assert ask(proxy, prompt).headers["x-gpucache"] == "miss"  # seen once: not kept
        assert ask(proxy, prompt).headers["x-gpucache"] == "exact"  # the second sighting was
    assert upstream.completions == [prompt] * 2


def test_an_answer_to_a_client_asking_no_store_is_never_kept(proxy, upstream):
    """RFC 9111's request ``no-store``: nothing of this exchange is kept (a stored answer may
    still serve it)."""
    assert (
        ask(proxy, "Who sculpted the Thinker?", **{"cache-control": "no-store"}).headers["x-gpucache"]
        == "miss"
    )
    assert ask(proxy, "Who sculpted the Thinker?").headers["x-gpucache"] == "miss"
    assert upstream.completions == ["Who sculpted the Thinker?"] * 2


def test_a_streamed_miss_is_relayed_as_sent_and_its_repeat_answered_from_the_cache(proxy, upstream):
    streamed = ask(proxy, "Spell the word cat", stream=True)
    assert streamed.status_code == 200 and streamed.headers["x-gpucache"] == "miss"
    pieces = [
        json.loads(line[6:])["choices"][0]["delta"].get("content", "")
        for line in streamed.text.splitlines()
        if line.startswith("data: {")
    ]
    assert "".join(pieces) == "answer to Spell the word cat"
    assert streamed.text.rstrip().endswith("data: [DONE]")
    whole = ask(proxy, "Spell the word cat")
    assert whole.headers["x-gpucache"] == "exact"
    assert whole.json()["choices"][0]["message"]["content"] == "answer to Spell the word cat"
    assert upstream.completions == ["Spell the word cat"]


def test_a_revoke_applied_from_another_replica_ends_the_credentials_kept_verdict(proxy, upstream):
    """A replica applies another's revoke as a clear under the credential (the share's tail
    calls ``apply_replicated_clear``); the proxy then checks the credential again before it
    serves it anything, rather than trusting the verdict it kept."""
    assert ask(proxy, "What is the launch code?").status_code == 200
    assert ask(proxy, "What is the launch code?").headers["x-gpucache"] == "exact"
    checks = upstream.checks
    state = proxy.app.state
    holder = state.config.tenancy.identify({"authorization": GOOD}).holder
    state.proxy.cache._core.replica.apply_replicated_clear(holder, under=True)
    again = ask(proxy, "What is the launch code?")
    assert again.headers["x-gpucache"] == "miss"  # its entries went with the clear
    assert upstream.checks == checks + 1  # and the credential was checked again
    assert ask(proxy, "What is the launch code?").headers["x-gpucache"] == "exact"
    assert upstream.checks == checks + 1  # a fresh verdict is kept again
