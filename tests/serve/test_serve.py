"""``gpucache serve`` through the official ``openai`` client: a real uvicorn server in front of an
OpenAI-compatible upstream that the tests run (tests/serving.py), with the real embedder.

Each test names its own tenant (the namespace header), so the tests share one proxy and never
each other's entries.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading

import pytest

# the serve extra and the official client: absent on a bare GPU machine, where these skip
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serving import Served, answer_to, free_port, keyless_proxy, make_upstream  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.keying import request_key  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402

ADMIN = "admin-secret-for-the-tests"
SECRET = b"tenancy-secret-for-the-tests"


@pytest.fixture(scope="module")
def upstream():
    with Served(make_upstream()) as served:
        yield served


@pytest.fixture(scope="module")
def proxy(upstream, real_embedder, tmp_path_factory):
    snapshot = str(tmp_path_factory.mktemp("snap") / "c.gpucache")
    app = keyless_proxy(f"{upstream.url}/v1", real_embedder, snapshot, ADMIN, SECRET)
    with Served(app) as served:
        yield served


def client(proxy, tenant: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key=kwargs.pop("api_key", "k"),
        max_retries=0,
        default_headers={"x-gpucache-namespace": tenant} if tenant else {},
        **kwargs,
    )


def ask(c: openai.OpenAI, text: str, **kwargs):
    """The raw response of a chat completion: its headers, and the parsed completion."""
    messages = kwargs.pop("messages", [{"role": "user", "content": text}])
    raw = c.chat.completions.with_raw_response.create(model="smol", messages=messages, **kwargs)
    return raw.headers, raw.parse()


def upstream_calls(upstream, text: str) -> int:
    return sum(1 for _, t in upstream.app.state.calls if t == text)


def test_exact_semantic_miss_and_near_miss(proxy, upstream):
    c = client(proxy, "t-tiers")
    headers, first = ask(c, "How do I reset my password?")
    assert headers["x-gpucache"] == "miss" and first.choices[0].message.content == answer_to(
        "How do I reset my password?"
    )
    headers, again = ask(c, "How do I reset my password?")
    assert (
        headers["x-gpucache"] == "exact"
        and again.choices[0].message.content == first.choices[0].message.content
    )
    headers, reworded = ask(c, "how can I reset my password")
    assert headers["x-gpucache"] == "semantic" and 0.8 < float(headers["x-gpucache-similarity"]) < 1.0
    assert reworded.choices[0].message.content == first.choices[0].message.content
    assert reworded.usage.total_tokens == 0  # nothing was generated for a hit
    headers, near = ask(c, "How do I reset my username?")  # a different question
    assert headers["x-gpucache"] == "miss" and near.choices[0].message.content == answer_to(
        "How do I reset my username?"
    )
    assert upstream_calls(upstream, "How do I reset my password?") == 1
    assert upstream_calls(upstream, "how can I reset my password") == 0


def test_a_near_miss_with_a_number_changed_is_a_miss(proxy):
    c = client(proxy, "t-near")
    ask(c, "Convert 10 miles to km")
    headers, answer = ask(c, "Convert 10 km to miles")
    assert headers["x-gpucache"] == "miss"
    assert answer.choices[0].message.content == answer_to("Convert 10 km to miles")


def test_a_miss_the_guard_refused_names_the_rule_streamed_or_not_within_the_tenant_only(proxy):
    from gpucache import LexicalNearMissVerifier

    stored, swapped, negated = (
        "Convert 26 miles to km",
        "Convert 26 km to miles",
        "Do not convert 26 miles to km",
    )
    guard = LexicalNearMissVerifier()
    c = client(proxy, "t-refused")
    headers, _ = ask(c, stored)
    assert headers["x-gpucache"] == "miss" and "x-gpucache-refused" not in headers  # nothing to judge
    headers, _ = ask(c, swapped)
    assert headers["x-gpucache"] == "miss"
    assert headers["x-gpucache-refused"] == guard.explain(stored, swapped).rule
    with c.chat.completions.with_streaming_response.create(
        model="smol", stream=True, messages=[{"role": "user", "content": negated}]
    ) as raw:
        assert raw.headers["x-gpucache"] == "miss" and raw.headers["x-gpucache-refused"] == "negation"
        list(raw.parse())
    # another tenant's near-miss of the same prompts: nothing of the first tenant is judged
    headers, _ = ask(client(proxy, "t-refused-other"), "Convert 26 km to miles, please")
    assert headers["x-gpucache"] == "miss" and "x-gpucache-refused" not in headers


def test_the_legacy_completions_endpoint_is_cached_too(proxy):
    c = client(proxy, "t-legacy")
    raw = c.completions.with_raw_response.create(model="smol", prompt="Name three primary colours")
    assert raw.headers["x-gpucache"] == "miss"
    raw = c.completions.with_raw_response.create(model="smol", prompt="Name three primary colours")
    assert raw.headers["x-gpucache"] == "exact"
    assert raw.parse().choices[0].text == answer_to("Name three primary colours")


def test_a_follow_up_matches_only_after_the_same_conversation(proxy, upstream):
    c = client(proxy, "t-turns")
    about_ada = [
        {"role": "user", "content": "Who was Ada Lovelace?"},
        {"role": "assistant", "content": "A mathematician."},
        {"role": "user", "content": "How old was she when she died?"},
    ]
    about_tesla = [
        {"role": "user", "content": "Who was Nikola Tesla?"},
        {"role": "assistant", "content": "An inventor."},
        {"role": "user", "content": "How old was she when she died?"},
    ]
    assert ask(c, "", messages=about_ada)[0]["x-gpucache"] == "miss"
    assert ask(c, "", messages=about_ada)[0]["x-gpucache"] == "exact"
    assert ask(c, "", messages=about_tesla)[0]["x-gpucache"] == "miss"
    system = [{"role": "system", "content": "Answer in French."}, about_ada[-1]]
    assert ask(c, "", messages=system)[0]["x-gpucache"] == "miss"
    assert upstream_calls(upstream, "How old was she when she died?") == 3


def test_a_follow_up_is_served_after_the_same_conversation_reworded_and_never_after_another(proxy, upstream):
    """By default the earlier turns are compared word for word: the same turns with the final
    question reworded are a semantic hit, other turns a miss."""
    c = client(proxy, "t-context")
    about_ada = [
        {"role": "user", "content": "Who was Ada Lovelace?"},
        {"role": "assistant", "content": "A mathematician."},
        {"role": "user", "content": "When was she born?"},
    ]
    asked_again = [*about_ada[:-1], {"role": "user", "content": "When was she born, please?"}]
    reworded = [
        {"role": "user", "content": "who was ada lovelace"},
        {"role": "assistant", "content": "A mathematician."},
        {"role": "user", "content": "When was she born?"},
    ]
    about_marie = [
        {"role": "user", "content": "Who was Marie Curie?"},
        {"role": "assistant", "content": "A physicist and chemist."},
        {"role": "user", "content": "When was she born?"},
    ]
    assert ask(c, "", messages=about_ada)[0]["x-gpucache"] == "miss"
    headers, answer = ask(c, "", messages=asked_again)
    assert headers["x-gpucache"] == "semantic"
    assert answer.choices[0].message.content == answer_to("When was she born?")
    assert ask(c, "", messages=reworded)[0]["x-gpucache"] == "miss"
    assert ask(c, "", messages=about_marie)[0]["x-gpucache"] == "miss"
    # a conversation holding a tool call keeps every earlier message in its scope: exact only
    tools = [
        about_ada[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bio", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "born 1815"},
        about_ada[-1],
    ]
    assert ask(c, "", messages=tools)[0]["x-gpucache"] == "miss"
    assert upstream_calls(upstream, "When was she born?") == 4


def test_a_conversation_an_earlier_version_stored_is_served_for_its_exact_repeat(proxy, upstream):
    """Before conversations were matched by meaning, every earlier turn was in the scope: such
    an entry (a snapshot's) is still served for exactly the same conversation."""
    messages = [
        {"role": "user", "content": "Who painted the Night Watch?"},
        {"role": "assistant", "content": "Rembrandt."},
        {"role": "user", "content": "Where does it hang?"},
    ]
    app = proxy.app
    tenant = app.state.config.tenancy.tenant(
        {"x-gpucache-namespace": "t-legacy-turns", "authorization": "Bearer k"}
    )
    key = request_key("chat", {"model": "smol", "messages": messages}, tenant)
    assert key.context and key.legacy_scope not in (None, key.scope)
    app.state.proxy.cache.put("Where does it hang?", "In the Rijksmuseum.", scope=key.legacy_scope)
    c = client(proxy, "t-legacy-turns")
    headers, answer = ask(c, "", messages=messages)
    assert headers["x-gpucache"] == "exact" and answer.choices[0].message.content == "In the Rijksmuseum."
    headers, _ = ask(c, "", messages=[*messages[:2], {"role": "user", "content": "Who bought it?"}])
    assert headers["x-gpucache"] == "miss"
    assert upstream_calls(upstream, "Where does it hang?") == 0


def test_every_setting_that_changes_the_answer_is_part_of_the_scope(proxy):
    c = client(proxy, "t-params")
    ask(c, "Write a haiku about rain")
    for params in (
        {"temperature": 0},
        {"temperature": 0.7},
        {"max_tokens": 20},
        {"seed": 1},
        {"stop": ["\n"]},
        {"top_p": 0.5},
        {"response_format": {"type": "json_object"}},
    ):
        assert ask(c, "Write a haiku about rain", **params)[0]["x-gpucache"] == "miss", params
    assert ask(c, "Write a haiku about rain", temperature=0)[0]["x-gpucache"] == "exact"
    assert ask(c, "Write a haiku about rain", user="someone")[0]["x-gpucache"] == "exact"  # transport only


def test_one_tenant_never_receives_another_tenants_entry(proxy):
    ask(client(proxy, "t-alice"), "What is my account balance?")
    assert ask(client(proxy, "t-bob"), "What is my account balance?")[0]["x-gpucache"] == "miss"
    # without a namespace header the API key decides: two keys, two tenants
    carol, dave = client(proxy, "", api_key="key-carol"), client(proxy, "", api_key="key-dave")
    ask(carol, "What is on my calendar today?")
    assert ask(carol, "What is on my calendar today?")[0]["x-gpucache"] == "exact"
    assert ask(dave, "What is on my calendar today?")[0]["x-gpucache"] == "miss"


@pytest.mark.parametrize(("params", "reason"), [({"n": 2}, "n"), ({"logprobs": True}, "logprobs")])
def test_requests_a_cache_cannot_stand_for_are_bypassed(proxy, upstream, params, reason):
    c = client(proxy, f"t-bypass-{reason}")
    text = f"Tell me a fact about owls ({reason})"
    assert ask(c, text, **params)[0]["x-gpucache"] == "bypass"
    assert ask(c, text, **params)[0]["x-gpucache"] == "bypass"
    assert upstream_calls(upstream, text) == 2
    assert f'gpucache_bypasses_total{{reason="{reason}"}}' in httpx.get(f"{proxy.url}/metrics").text


def test_a_last_message_that_is_not_the_users_or_too_short_is_bypassed(proxy):
    c = client(proxy, "t-bypass-shape")
    tool_turn = [
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": "Let me check."},
    ]
    assert ask(c, "", messages=tool_turn)[0]["x-gpucache"] == "bypass"
    assert ask(c, " ")[0]["x-gpucache"] == "bypass"


def test_a_streamed_miss_then_a_streamed_hit_parse_in_the_client(proxy, upstream):
    c = client(proxy, "t-stream")
    text = "Explain what a closure is"
    with c.chat.completions.with_streaming_response.create(
        model="smol", stream=True, messages=[{"role": "user", "content": text}]
    ) as raw:
        assert raw.headers["x-gpucache"] == "miss"
        chunks = list(raw.parse())
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == answer_to(text)
    assert chunks[-1].choices[0].finish_reason == "stop"
    stream = c.chat.completions.create(
        model="smol",
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Explain what a closure is."}],
    )
    replayed = list(stream)
    assert replayed[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in replayed if ch.choices) == answer_to(text)
    assert [ch.choices[0].finish_reason for ch in replayed if ch.choices][-1] == "stop"
    assert replayed[-1].usage is not None and replayed[-1].choices == []
    assert upstream_calls(upstream, text) == 1


def test_an_answer_stored_either_way_is_served_the_other_way(proxy):
    c = client(proxy, "t-cross")
    ask(c, "What is the capital of Peru?")  # stored from JSON
    stream = c.chat.completions.create(
        model="smol", stream=True, messages=[{"role": "user", "content": "What is the capital of Peru?"}]
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == answer_to(
        "What is the capital of Peru?"
    )
    list(
        c.chat.completions.create(
            model="smol",
            stream=True,
            messages=[  # stored from a stream
                {"role": "user", "content": "What is the capital of Chile?"}
            ],
        )
    )
    headers, answer = ask(c, "What is the capital of Chile?")
    assert headers["x-gpucache"] == "exact"
    assert answer.choices[0].message.content == answer_to("What is the capital of Chile?")


@pytest.mark.parametrize("status", [500, 429])
def test_an_upstream_error_passes_through_unchanged_and_is_never_cached(proxy, upstream, status):
    text = f"Summarise this [{status}]"
    raw = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        headers={"x-gpucache-namespace": "t-err"},
        json={"model": "smol", "messages": [{"role": "user", "content": text}]},
    )
    assert raw.status_code == status and raw.json()["error"]["message"] in ("the model crashed", "slow down")
    assert raw.headers["retry-after"] == ("7" if status == 500 else "3")
    with pytest.raises(openai.APIStatusError):
        ask(client(proxy, "t-err"), text)
    assert upstream_calls(upstream, text) == 2


@pytest.mark.parametrize("marker", ["[length]", "[tool]"])
def test_incomplete_or_tool_call_answers_are_served_but_not_stored(proxy, upstream, marker):
    c = client(proxy, "t-incomplete")
    text = f"Write a long essay {marker}"
    for _ in range(2):
        headers, answer = ask(c, text)
        assert headers["x-gpucache"] == "miss"
    assert answer.choices[0].finish_reason == ("length" if marker == "[length]" else "tool_calls")
    stream = list(
        c.chat.completions.create(model="smol", stream=True, messages=[{"role": "user", "content": text}])
    )
    assert [ch.choices[0].finish_reason for ch in stream if ch.choices][-1] in ("length", "tool_calls")
    assert upstream_calls(upstream, text) == 3


def test_cache_control_no_cache_refreshes_and_no_store_keeps_nothing(proxy, upstream):
    c = client(proxy, "t-control")
    ask(c, "What time zone is Lima in?")
    headers, _ = ask(c, "What time zone is Lima in?", extra_headers={"cache-control": "no-cache"})
    assert headers["x-gpucache"] == "miss" and upstream_calls(upstream, "What time zone is Lima in?") == 2
    ask(c, "What time zone is Quito in?", extra_headers={"cache-control": "no-store"})
    assert ask(c, "What time zone is Quito in?")[0]["x-gpucache"] == "miss"
    ask(c, "What time zone is Bogota in?", extra_headers={"cache-control": "no-cache"})  # stored
    assert ask(c, "What time zone is Bogota in?")[0]["x-gpucache"] == "exact"


def test_bad_requests_get_an_openai_error_and_no_retry(proxy):
    url = f"{proxy.url}/v1/chat/completions"
    bad_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.headers["x-should-retry"] == "false"
    assert set(bad_json.json()["error"]) == {"message", "type", "param", "code"}
    wrong = httpx.post(url, json={"model": "smol", "messages": "hello"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "messages"
    no_model = httpx.post(url, json={"messages": [{"role": "user", "content": "hi there"}]})
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
    huge = httpx.post(
        url, json={"model": "smol", "messages": [{"role": "user", "content": "x" * (9 * 2**20)}]}
    )
    assert huge.status_code == 413 and huge.headers["x-should-retry"] == "false"
    with pytest.raises(openai.BadRequestError):
        client(proxy, "t-bad").chat.completions.create(model="smol", messages="hello")  # type: ignore[arg-type]


def test_everything_else_under_v1_is_forwarded_and_never_cached(proxy, upstream):
    c = client(proxy, "t-pass")
    assert [m.id for m in c.models.list()] == ["smol"]
    raw = c.embeddings.with_raw_response.create(model="e", input="hello")
    assert raw.headers["x-gpucache"] == "bypass" and raw.parse().data[0].embedding == [0.1, 0.2]
    c.embeddings.create(model="e", input="hello")
    assert sum(1 for kind, _ in upstream.app.state.calls if kind == "embeddings") >= 2


def lookup_batches(proxy) -> float:
    for line in httpx.get(f"{proxy.url}/metrics").text.splitlines():
        if line.startswith("gpucache_lookup_batches_total"):
            return float(line.split()[-1])
    raise AssertionError("no gpucache_lookup_batches_total in /metrics")


class FirstCallHeld:
    """The real embedder, its first call held (in the embedder's thread) until ``ready()``
    says so: the requests the test sends gather behind that batch meanwhile. ``watch`` makes
    each lookup the cache submits announce that it has joined, so the hold waits on that
    event, never on a time guessed."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.dim, self.device = inner, inner.name, inner.dim, inner.device
        self.ready = lambda: True
        self.calls: list[int] = []  # each call's batch size
        self.joined = threading.Condition()

    def watch(self, coalescer) -> None:
        submit = coalescer.submit

        async def announced(request, timeout=None):
            task = asyncio.ensure_future(submit(request, timeout))
            await asyncio.sleep(0)  # one turn of the loop: the task's first step filed its ticket
            with self.joined:
                self.joined.notify_all()
            return await task

        coalescer.submit = announced

    def encode(self, texts):
        if not self.calls:
            with self.joined:
                self.joined.wait_for(self.ready, timeout=60)
        self.calls.append(len(texts))
        return self.inner.encode(texts)


def test_sixty_four_concurrent_clients_share_lookup_batches_and_one_upstream_call_per_prompt(
    upstream, real_embedder
):
    """The first of 64 requests is looked up at once, alone (no batch was computing); the 63
    that arrive while it is in the embedder (held there until all 63 have gathered) share the
    next batch, sent as it returns: two batches, where looked up one by one they would be 64.
    Single-flight then loads each of the 8 distinct prompts once."""
    prompts = [f"[slow] Gathered question number {i} about subject {i}" for i in range(8)]
    held = FirstCallHeld(real_embedder)
    made: list[SemanticCache] = []

    def factory() -> SemanticCache:
        made.append(
            SemanticCache(
                held, device="cpu", lookup_batch=64, lookup_window_seconds=0.002, lookup_timeout_seconds=120.0
            )
        )
        held.ready = lambda: made[0]._core.onloop.coalescer.gathered >= 63
        held.watch(made[0]._core.onloop.coalescer)
        return made[0]

    app = create_app(
        ServeSettings(upstream=f"{upstream.url}/v1", namespace_secret=SECRET), cache_factory=factory
    )
    with Served(app) as served:
        assert lookup_batches(served) == 0

        async def main():
            c = openai.AsyncOpenAI(
                base_url=f"{served.url}/v1",
                api_key="k",
                max_retries=0,
                timeout=120,
                default_headers={"x-gpucache-namespace": "t-burst"},
            )
            async with c:
                return await asyncio.gather(
                    *(
                        c.chat.completions.create(
                            model="smol", messages=[{"role": "user", "content": prompts[i % 8]}]
                        )
                        for i in range(64)
                    )
                )

        answers = asyncio.run(main())
        assert [a.choices[0].message.content for a in answers] == [
            answer_to(prompts[i % 8]) for i in range(64)
        ]
        assert [upstream_calls(upstream, p) for p in prompts] == [1] * 8
        assert lookup_batches(served) == 2
        assert held.calls[:2] == [1, 8]  # the lone one; then the 63, the 8 prompts embedded once


def test_metrics_count_what_happened(proxy):
    def count(outcome: str) -> float:
        for line in httpx.get(f"{proxy.url}/metrics").text.splitlines():
            if line.startswith(f'gpucache_requests_total{{endpoint="chat/completions",outcome="{outcome}"}}'):
                return float(line.split()[-1])
        return 0.0

    before = {o: count(o) for o in ("miss", "exact", "semantic")}
    c = client(proxy, "t-metrics")
    ask(c, "What is the boiling point of water at sea level?")
    ask(c, "What is the boiling point of water at sea level?")
    ask(c, "what's the boiling point of water at sea level")
    after = {o: count(o) for o in ("miss", "exact", "semantic")}
    assert {o: after[o] - before[o] for o in after} == {"miss": 1, "exact": 1, "semantic": 1}
    text = httpx.get(f"{proxy.url}/metrics").text
    assert "gpucache_entries " in text and "gpucache_lookup_seconds_count" in text
    assert "gpucache_hit_similarity_bucket" in text and "gpucache_device_bytes " in text
    timings = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("gpucache_embed", "gpucache_scan"))
    }
    assert timings["gpucache_embed_seconds_total"] > 0 and timings["gpucache_embedded_prompts_total"] >= 2
    assert timings["gpucache_scan_seconds_total"] > 0 and timings["gpucache_scans_total"] >= 1


def test_health_says_ready_and_whether_the_upstream_answers(proxy):
    health = httpx.get(f"{proxy.url}/health", headers={"authorization": f"Bearer {ADMIN}"}).json()
    assert health["status"] == "ok" and health["upstream"] == "reachable"


def test_admin_endpoints_need_the_token_and_do_their_job(proxy, real_embedder):
    c = client(proxy, "t-admin")
    ask(c, "What is the speed of light?")
    assert ask(c, "What is the speed of light?")[0]["x-gpucache"] == "exact"  # a hit to count
    request = {
        "kind": "chat",
        "namespace": "t-admin",
        "credentials": {"authorization": "Bearer k"},
        "request": {
            "model": "smol",
            "messages": [{"role": "user", "content": "What is the speed of light?"}],
        },
    }
    assert httpx.post(f"{proxy.url}/admin/invalidate", json=request).status_code == 401
    auth = {"authorization": f"Bearer {ADMIN}"}
    assert httpx.post(f"{proxy.url}/admin/invalidate", json=request, headers=auth).json() == {"removed": True}
    assert ask(c, "What is the speed of light?")[0]["x-gpucache"] == "miss"
    stats = httpx.get(f"{proxy.url}/admin/stats", headers=auth).json()
    hits = stats["exact_hits"] + stats["semantic_hits"]
    assert stats["entries"] >= 1 and hits >= 1 and stats["misses"] >= 2  # this test's own traffic
    assert stats["hit_rate"] == pytest.approx(hits / (hits + stats["misses"]))
    assert httpx.post(f"{proxy.url}/admin/clear", json=request, headers=auth).status_code == 200
    assert ask(c, "What is the speed of light?")[0]["x-gpucache"] == "miss"
    saved = httpx.post(f"{proxy.url}/admin/snapshot", headers=auth).json()["saved"]
    entries = httpx.get(f"{proxy.url}/admin/stats", headers=auth).json()["entries"]
    assert len(SemanticCache.load(saved, embedder=real_embedder, device="cpu")) == entries


def test_every_admin_route_the_app_has_is_one_of_those_checked_below(proxy):
    """The router checks the token for every route it holds; the routes are listed below so
    that each is also asked for real."""

    def walk(routes):  # an included router stands as one route holding its own
        for r in routes:
            inner = getattr(r, "original_router", None)
            yield from walk(inner.routes) if inner is not None else (r,)

    routes = {
        (m, r.path.removeprefix("/admin/"))
        for r in walk(proxy.app.routes)
        if getattr(r, "path", "").startswith("/admin")
        for m in r.methods
    }
    assert routes == set(ADMIN_ROUTES)


def test_a_route_added_to_the_admin_router_is_closed_without_its_own_check():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from gpucache.serve import admin

    admin.router.add_api_route("/added-later", lambda: {"open": True}, methods=["GET"])
    try:
        app = FastAPI()
        app.include_router(admin.router)
        app.state.config = ServeSettings(
            upstream="http://127.0.0.1:9/v1", admin_token=ADMIN, require_auth=False
        )
        app.add_exception_handler(admin.AdminRefusal, lambda request, exc: exc.response)
        with TestClient(app) as client:
            assert client.get("/admin/added-later").status_code == 401
            opened = client.get("/admin/added-later", headers={"authorization": f"Bearer {ADMIN}"})
            assert opened.json() == {"open": True}
    finally:
        admin.router.routes.pop()


ADMIN_ROUTES = [
    ("POST", "invalidate"),
    ("POST", "clear"),
    ("POST", "revoke"),
    ("POST", "snapshot"),
    ("GET", "stats"),
]


@pytest.mark.parametrize("method, path", ADMIN_ROUTES)
def test_every_admin_endpoint_refuses_a_wrong_token_before_its_body_is_read(proxy, method, path):
    for token in (None, "Bearer not-the-admin-token", f"Basic {ADMIN}"):
        headers = {"authorization": token} if token else {}
        refused = httpx.request(method, f"{proxy.url}/admin/{path}", headers=headers, content=b"{not json")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    answered = httpx.request(
        method,
        f"{proxy.url}/admin/{path}",
        content=b"{not json",
        headers={"authorization": f"bearer {ADMIN}"},
    )
    assert answered.status_code == (400 if method == "POST" and path != "snapshot" else 200)


def test_a_text_that_imitates_a_conversation_key_goes_upstream_uncached(proxy, upstream):
    """A client's text that starts as the cache's conversation keys do is the client's own
    text: answered by the upstream, never stored, never read as another conversation."""
    text = "\x00gpucache-conversation-1\x00" + '[["user","who was Ada?"],"When was she born?"]'
    c = client(proxy, "t-imitation")
    for _ in range(2):
        headers, answer = ask(c, text)
        assert headers["x-gpucache"] == "bypass" and answer.choices[0].message.content == answer_to(text)
        raw = c.completions.with_raw_response.create(model="smol", prompt=text)
        assert raw.status_code == 200 and raw.headers["x-gpucache"] == "bypass"
    assert upstream_calls(upstream, text) == 4


def test_a_client_that_disconnects_mid_stream_cancels_the_upstream_and_stores_nothing(proxy, upstream):
    text = "[drip] Tell me a very long story"
    upstream.app.state.closed.clear()
    with (
        httpx.Client(timeout=30) as h,
        h.stream(
            "POST",
            f"{proxy.url}/v1/chat/completions",
            headers={"x-gpucache-namespace": "t-gone"},
            json={"model": "smol", "stream": True, "messages": [{"role": "user", "content": text}]},
        ) as r,
    ):
        assert r.headers["x-gpucache"] == "miss"
        lines = r.iter_lines()
        assert next(line for line in lines if '"content"' in line and "The" in line)
    # the client is gone: the proxy closed its upstream request
    assert upstream.app.state.closed.wait(10)
    httpx.post(f"{upstream.url}/control/drip")
    headers, _ = ask(client(proxy, "t-gone"), text)
    assert headers["x-gpucache"] == "miss" and upstream_calls(upstream, text) == 2


# ----------------------------------------------------------------------------- failures


def test_an_upstream_that_is_down_is_a_502_and_one_that_stalls_a_504(real_embedder):
    down = ServeSettings(upstream=f"http://127.0.0.1:{free_port()}/v1")
    app = create_app(down, cache_factory=lambda: SemanticCache(real_embedder, device="cpu"))
    with Served(app) as served:
        with pytest.raises(openai.InternalServerError) as exc:
            ask(client(served, "t-down"), "Is anybody there?")
        assert exc.value.status_code == 502 and exc.value.body["code"] == "upstream_unavailable"
    with Served(make_upstream()) as up:
        slow = ServeSettings(upstream=f"{up.url}/v1", upstream_timeout=0.5)
        app = create_app(slow, cache_factory=lambda: SemanticCache(real_embedder, device="cpu"))
        with Served(app) as served:
            with pytest.raises(openai.APIStatusError) as exc:
                ask(client(served, "t-stall"), "Are you there? [stall]")
            assert exc.value.status_code == 504 and exc.value.body["code"] == "upstream_timeout"


def test_a_cache_that_fails_fails_open(upstream, fake_embedder):
    fake_embedder.fail_with = RuntimeError("CUDA error: an illegal memory access")
    config = ServeSettings(upstream=f"{upstream.url}/v1")
    app = create_app(config, cache_factory=lambda: SemanticCache(fake_embedder, device="cpu"))
    with Served(app) as served:
        headers, answer = ask(client(served, "t-broken"), "Does the cache matter?")
        assert answer.choices[0].message.content == answer_to("Does the cache matter?")
        stream = client(served, "t-broken").chat.completions.create(
            model="smol", stream=True, messages=[{"role": "user", "content": "And streamed?"}]
        )
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == answer_to(
            "And streamed?"
        )
        assert 'gpucache_errors_total{kind="cache"} 2.0' in httpx.get(f"{served.url}/metrics").text


def test_sigterm_finishes_and_saves_the_snapshot_which_the_next_start_serves(upstream, tmp_path):
    snapshot, port = tmp_path / "cache.gpucache", free_port()
    command = [
        sys.executable,
        "-m",
        "gpucache",
        "serve",
        "--upstream",
        f"{upstream.url}/v1",
        "--port",
        str(port),
        "--snapshot",
        str(snapshot),
        "--log-level",
        "info",
    ]
    env = {**os.environ, "GPUCACHE_NAMESPACE_SECRET": "a-stable-secret-of-some-length"}

    def start():
        """The server process, once it says it serves: its log line is the event waited on
        (within two minutes, the model's load included); its output is drained throughout."""
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        ready, lines = threading.Event(), []

        def drain():
            for line in process.stdout:
                lines.append(line)
                if "Uvicorn running on" in line:
                    ready.set()
            ready.set()  # it exited: the wait ends, and the check below says so

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(120) or process.poll() is not None:
            process.kill()
            raise AssertionError("".join(lines) or "the server did not start")
        return process

    served = type("S", (), {"url": f"http://127.0.0.1:{port}"})
    process = start()
    try:
        assert ask(client(served, "", api_key="key-sig"), "Where is Machu Picchu?")[0]["x-gpucache"] == "miss"
    finally:
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal so the exit status tells it
        assert process.wait(60) in (0, -signal.SIGTERM)
    assert snapshot.exists()
    process = start()
    try:
        assert (
            ask(client(served, "", api_key="key-sig"), "Where is Machu Picchu?")[0]["x-gpucache"] == "exact"
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def test_a_corrupt_snapshot_is_set_aside_and_the_proxy_starts_empty(upstream, real_embedder, tmp_path):
    snapshot = tmp_path / "cache.gpucache"
    snapshot.write_bytes(b"not a snapshot at all")
    config = ServeSettings(upstream=f"{upstream.url}/v1", snapshot=str(snapshot), namespace_secret=SECRET)
    app = create_app(config, cache_factory=lambda: SemanticCache(real_embedder, device="cpu"))
    with Served(app) as served:
        assert ask(client(served, "t-corrupt"), "Is the cache empty?")[0]["x-gpucache"] == "miss"
    assert (tmp_path / "cache.gpucache.corrupt").read_bytes() == b"not a snapshot at all"
    # saved at shutdown: a whole, loadable file holding the one answer stored since
    assert len(SemanticCache.load(str(snapshot), embedder=real_embedder, device="cpu")) == 1


@pytest.mark.parametrize("removal", ["invalidate", "clear", "revoke"])
def test_an_answer_loading_across_an_admin_removal_is_not_stored(real_embedder, tmp_path, removal):
    """A request whose answer is loading when an operator removes its entry (invalidate, a
    clear of its scope, a revoke of its credential) gets its answer, and the answer is not
    stored after the removal returned: a model update followed by a clear keeps no old answer."""
    text = "[drip] What is the tallest mountain in the Alps?"
    body = {"model": "smol", "messages": [{"role": "user", "content": text}]}
    with Served(make_upstream()) as upstream:
        app = keyless_proxy(f"{upstream.url}/v1", real_embedder, str(tmp_path / "c.gpucache"), ADMIN, SECRET)
        with Served(app) as proxy:
            c = client(proxy, "t-removal", api_key="sk-removal")
            got: list[str] = []
            caller = threading.Thread(target=lambda: got.append(ask(c, text)[0]["x-gpucache"]))
            caller.start()
            arrived = upstream.app.state.arrived
            with arrived:  # the request is held at the upstream: its answer is loading
                assert arrived.wait_for(lambda: ("chat", text) in upstream.app.state.calls, timeout=60)
            auth = {"authorization": f"Bearer {ADMIN}"}
            target = {
                "kind": "chat",
                "namespace": "t-removal",
                "credentials": {"authorization": "Bearer sk-removal"},
                "request": body,
            }
            path, doc = {
                "invalidate": ("/admin/invalidate", target),
                "clear": ("/admin/clear", target),
                "revoke": ("/admin/revoke", {"key": "sk-removal"}),
            }[removal]
            assert httpx.post(f"{proxy.url}{path}", json=doc, headers=auth).status_code == 200
            httpx.post(f"{upstream.url}/control/drip")
            caller.join(60)
            assert got == ["miss"]
            assert ask(c, text)[0]["x-gpucache"] == "miss"  # not stored: the model is asked again
            assert ask(c, text)[0]["x-gpucache"] == "exact"  # stored this time
