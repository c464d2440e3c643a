"""A credential the upstream refuses gets nothing from the cache, end to end: a real uvicorn
server driven by the official ``openai`` client, in front of the stand-in upstream, which
refuses the keys a test revokes (``app.state.revoked``) and records each check
(``app.state.checks``)."""

from __future__ import annotations

import asyncio

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serving import Served, make_upstream  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.auth import Allowed, CredentialCheck, Denied, Unverified  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402
from gpucache.serve.upstream import UpstreamUnavailable  # noqa: E402

SECRET = b"tenancy-secret-for-auth-tests"


def served_proxy(upstream, real_embedder, **settings):
    config = ServeSettings(upstream=f"{upstream.url}/v1", namespace_secret=SECRET, **settings)
    return Served(create_app(config, cache_factory=lambda: SemanticCache(
        real_embedder, device="cpu", lookup_timeout_seconds=30.0)))


def chat(proxy, key, text, stream=False):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": text}]
    if stream:
        with c.chat.completions.with_streaming_response.create(
                model="smol", messages=messages, stream=True) as r:
            list(r.iter_lines())
            return r.headers["x-gpucache"]
    return c.chat.completions.with_raw_response.create(model="smol", messages=messages).headers["x-gpucache"]


def test_a_revoked_key_gets_the_upstreams_401_and_nothing_from_its_cache(real_embedder):
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth_ttl=0) as proxy:
        text = "What did I ask about my medical results?"
        assert chat(proxy, "sk-bob", text) == "miss"
        assert chat(proxy, "sk-bob", text) == "exact"
        upstream.app.state.revoked.add("sk-bob")
        completions = len(upstream.app.state.calls)
        for ask in (lambda: chat(proxy, "sk-bob", text),
                    lambda: chat(proxy, "sk-bob", text, stream=True),
                    lambda: chat(proxy, "sk-bob", "what did i ask about my medical results")):
            with pytest.raises(openai.AuthenticationError) as refused:
                ask()
            assert refused.value.status_code == 401
            assert refused.value.body["code"] == "invalid_api_key"  # the upstream's own answer
        assert len(upstream.app.state.calls) == completions  # no completion reached the upstream
        assert chat(proxy, "sk-alice", text) == "miss"  # another key is unaffected


def test_a_verdict_is_kept_for_auth_ttl_and_checked_once_per_key(real_embedder):
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth_ttl=3600) as proxy:
        for n in range(4):
            chat(proxy, "sk-carol", f"Tell me fact number {n} about owls")
        assert upstream.app.state.checks.count("sk-carol") == 1
        upstream.app.state.revoked.add("sk-carol")
        # within the verdict's lifetime the earlier word stands: a revocation takes auth_ttl
        assert chat(proxy, "sk-carol", "Tell me fact number 0 about owls") == "exact"


def test_with_auth_none_the_upstream_is_never_asked(real_embedder):
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth="none") as proxy:
        text = "Is anyone checking my key?"
        assert chat(proxy, "sk-dave", text) == "miss"
        upstream.app.state.revoked.add("sk-dave")
        # what the mode means: the cache answers whoever holds a key it has seen
        assert chat(proxy, "sk-dave", text) == "exact"
        assert upstream.app.state.checks == []


def test_an_unknown_auth_mode_is_refused_at_start():
    with pytest.raises(ValueError, match="auth must be one of"):
        ServeSettings(upstream="http://127.0.0.1:9/v1", auth="trust-me")


class Response:
    def __init__(self, status):
        self.status_code, self.headers, self.content = status, {}, b'{"error": {}}'


class FakeUpstream:
    """Answers each check with the next status (or raises ``UpstreamUnavailable`` for None),
    after ``release`` is set, so that concurrent checks overlap."""

    def __init__(self, statuses):
        self.statuses, self.sent = list(statuses), 0
        self.release = asyncio.Event()

    async def send(self, method, path, headers, body, params=""):
        assert (method, path) == ("GET", "models")
        self.sent += 1
        await self.release.wait()
        status = self.statuses.pop(0)
        if status is None:
            raise UpstreamUnavailable(502, "down")
        return Response(status)


def test_concurrent_checks_of_one_credential_ask_once():
    async def main():
        up = FakeUpstream([200])
        check = CredentialCheck(up, ttl=60)
        tasks = [asyncio.create_task(check.check("key:a", {}, "")) for _ in range(5)]
        await asyncio.sleep(0)  # all five are waiting on the one check (a scheduling point)
        up.release.set()
        return await asyncio.gather(*tasks), up.sent

    verdicts, sent = asyncio.run(main())
    assert sent == 1 and all(isinstance(v, Allowed) for v in verdicts)


def test_an_upstream_that_cannot_answer_keeps_a_verdict_seen_before_and_refuses_a_new_one():
    now = [0.0]

    async def main():
        up = FakeUpstream([403, None, None])
        up.release.set()
        check = CredentialCheck(up, ttl=10, clock=lambda: now[0])
        first = await check.check("key:a", {}, "")
        now[0] = 11.0  # expired: asked again, and the upstream is down
        again = await check.check("key:a", {}, "")
        never = await check.check("key:b", {}, "")
        return first, again, never

    first, again, never = asyncio.run(main())
    assert isinstance(first, Denied) and first.status == 403
    assert again == first  # the upstream's last word stands while it cannot be asked
    assert isinstance(never, Unverified) and never.status == 502
