"""A credential the upstream refuses gets nothing from the cache, end to end: a real uvicorn
server driven by the official ``openai`` client, in front of the stand-in upstream, which
refuses the keys a test revokes (``app.state.revoked``) and records each check
(``app.state.checks``)."""

from __future__ import annotations

import asyncio
import os
import time

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
    return Served(
        create_app(
            config,
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu", lookup_timeout_seconds=30.0),
        )
    )


def chat(proxy, key, text, stream=False):
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": text}]
    if stream:
        with c.chat.completions.with_streaming_response.create(
            model="smol", messages=messages, stream=True
        ) as r:
            list(r.iter_lines())
            return r.headers["x-gpucache"]
    return c.chat.completions.with_raw_response.create(model="smol", messages=messages).headers["x-gpucache"]


def test_gpucache_serve_serves_keys_again_once_the_upstream_refuses_made_up_keys_again(real_embedder):
    """An upstream whose /v1/models answered anyone for a while (a maintenance page) lost its
    standing, and every key got 503; once it refuses a made-up key again, keys are served
    again, without a restart."""
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth_ttl=0) as proxy:
        text = "Which platform does the night train to Vienna leave from?"
        assert chat(proxy, "sk-hana", text) == "miss"
        upstream.app.state.public_models = True
        with pytest.raises(openai.InternalServerError) as refused:
            chat(proxy, "sk-hana", text)
        assert refused.value.status_code == 503 and "--auth keys" in str(refused.value.body)
        upstream.app.state.public_models = False
        assert chat(proxy, "sk-hana", text) == "exact"


def test_a_body_forwarded_unparsed_is_still_refused_on_its_credentials_first(real_embedder):
    """A body of more values than the proxy parses (forwarded as it came: 'many-values') meets
    the same checks first: a revoked key gets the upstream's 401 and no completion reaches it,
    a credential header sent twice and one that names no tenant are 400s."""
    import httpx

    from gpucache.serve.keying import MAX_JSON_VALUES

    body = {
        "model": "smol",
        "messages": [{"role": "user", "content": "Which of my values reach the model?"}],
        "values": list(range(MAX_JSON_VALUES)),
    }
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth_ttl=0) as proxy:

        def post(*headers):
            return httpx.post(
                f"{proxy.url}/v1/chat/completions",
                json=body,
                headers=[("content-type", "application/json"), *headers],
                timeout=60,
            )

        assert post(("authorization", "Bearer sk-vera")).headers["x-gpucache"] == "bypass"
        upstream.app.state.revoked.add("sk-vera")
        completions = len(upstream.app.state.calls)
        assert post(("authorization", "Bearer sk-vera")).status_code == 401
        twice = post(("authorization", "Bearer sk-walt"), ("authorization", "Bearer sk-vera"))
        unhashed = post(("authorization", "Bearer sk-walt"), ("x-openai-key", "sk-vera"))
        assert (twice.status_code, unhashed.status_code) == (400, 400)
        assert unhashed.json()["error"]["code"] == "unhashed_credential"
        assert len(upstream.app.state.calls) == completions  # none of them reached the model


def test_a_revoked_key_gets_the_upstreams_401_and_nothing_from_its_cache(real_embedder):
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth_ttl=0) as proxy:
        text = "What did I ask about my medical results?"
        assert chat(proxy, "sk-bob", text) == "miss"
        assert chat(proxy, "sk-bob", text) == "exact"
        upstream.app.state.revoked.add("sk-bob")
        completions = len(upstream.app.state.calls)
        for ask in (
            lambda: chat(proxy, "sk-bob", text),
            lambda: chat(proxy, "sk-bob", text, stream=True),
            lambda: chat(proxy, "sk-bob", "what did i ask about my medical results"),
        ):
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

    probe_status = 401  # what it answers the proxy's probe (a key it never issued)

    async def send(self, method, path, headers, body, params="", timeout=None):
        assert (method, path) == ("GET", "models")
        if headers.get("authorization", "").startswith("Bearer gpucache-probe-"):
            self.probed = getattr(self, "probed", 0) + 1
            if self.probe_status is None:
                raise UpstreamUnavailable(502, "down")
            if self.probe_status == "hang":
                await asyncio.Event().wait()
            return Response(self.probe_status)
        self.sent += 1
        self.timeout = timeout
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


def test_an_upstream_that_stops_checking_keys_is_found_out_at_the_next_verdict_past_a_ttl():
    """The probe is asked again, at most once a ttl, before a verdict: an upstream replaced by
    one whose /v1/models is public (a llama.cpp server) would otherwise allow every key from
    then on, a revoked one included, while the proxy kept its word from start."""
    now = [0.0]

    async def main():
        up = FakeUpstream([200, 200, 200])
        up.release.set()
        check = CredentialCheck(up, ttl=10, clock=lambda: now[0])
        first = await check.check("key:a", {}, "")
        now[0] = 11.0  # a verdict is needed again; the upstream still refuses a made-up key
        again = await check.check("key:a", {}, "")
        probed_then = up.probed
        now[0] = 15.0
        within = await check.check("key:b", {}, "")  # a new key within the ttl: no new probe
        up.probe_status = 200  # now its /v1/models answers any key
        now[0] = 22.0
        after = await check.check("key:a", {}, "")
        return first, again, probed_then, within, after, up.probed

    first, again, probed_then, within, after, probed = asyncio.run(main())
    assert isinstance(first, Allowed) and isinstance(again, Allowed) and isinstance(within, Allowed)
    assert probed_then == 2 and probed == 3
    assert isinstance(after, Unverified) and after.status == 503 and "--auth keys" in after.message


def test_a_hung_recheck_of_a_known_key_holds_its_request_a_moment_not_the_checks_timeout():
    """With /v1/models hung, a key whose verdict expired is served on its last verdict after a
    short wait (its hits are not held for the check's whole timeout, once a ttl for as long as
    the outage lasts); the check goes on, and its answer decides the requests after it. A key
    never seen still waits for its check: there is no last word to serve it on."""
    from gpucache.serve.auth import STALE_WAIT

    now = [0.0]

    async def main():
        up = FakeUpstream([200, 401, 200])
        up.release.set()
        check = CredentialCheck(up, ttl=10, clock=lambda: now[0], timeout=30, grace=60)
        first = await check.check("key:a", {}, "")
        up.release.clear()  # the upstream's /v1/models hangs from now on
        now[0] = 11.0
        began = time.perf_counter()
        stale = await check.check("key:a", {}, "")
        waited = time.perf_counter() - began
        still_asking = "key:a" in check.asking and up.sent == 2
        new = asyncio.ensure_future(check.check("key:b", {}, ""))
        await asyncio.sleep(2 * STALE_WAIT)
        new_waits = not new.done()
        up.release.set()  # the hung check answers at last: the key was revoked meanwhile
        await new
        after = await check.check("key:a", {}, "")
        return first, stale, waited, still_asking, new_waits, after

    first, stale, waited, still_asking, new_waits, after = asyncio.run(main())
    assert isinstance(first, Allowed) and stale == first and still_asking and new_waits
    assert STALE_WAIT <= waited < 10 * STALE_WAIT  # the check's timeout is 30 s
    assert isinstance(after, Denied) and after.status == 401


def test_a_hung_probe_of_the_upstreams_standing_holds_a_known_keys_request_a_moment():
    """Confirming, once a ttl, that the upstream still refuses a made-up key must not hold a
    key's requests for the probe's timeout when /v1/models hangs: they wait as briefly as on a
    known key's re-check, and the upstream's standing is left as it was."""
    from gpucache.serve.auth import STALE_WAIT

    now = [0.0]

    async def main():
        up = FakeUpstream([200, 200])
        up.release.set()
        check = CredentialCheck(up, ttl=10, clock=lambda: now[0], timeout=30, grace=60)
        await check.check("key:a", {}, "")
        up.probe_status = "hang"
        now[0] = 11.0
        began = time.perf_counter()
        verdict = await check.check("key:a", {}, "")
        waited = time.perf_counter() - began
        check.confirming.cancel()
        return verdict, waited, check.authority

    verdict, waited, authority = asyncio.run(main())
    assert isinstance(verdict, Allowed) and authority is True
    assert waited < 10 * STALE_WAIT  # the probe's timeout is 30 s


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


def test_a_clear_under_a_credential_ends_its_kept_verdict_and_nothing_extends_it():
    """A revoke, here or on another replica, clears everything under the credential
    (``ClearedPrefixes``): the verdict kept from before is asked again, and while the upstream
    cannot answer it is not extended either; another credential's verdict stands."""
    from gpucache.cache.replication import ClearedPrefixes

    async def main():
        up = FakeUpstream([200, 200, 200, None])
        up.release.set()
        cleared = ClearedPrefixes()
        check = CredentialCheck(up, ttl=60, cleared=cleared)
        await check.check("key:a", {}, "")
        await check.check("key:b", {}, "")
        await check.check("key:a", {}, "")
        kept = up.sent
        cleared.cleared("key:a")
        again = await check.check("key:a", {}, "")
        other = await check.check("key:b", {}, "")
        after = up.sent
        cleared.cleared("key:a")
        down = await check.check("key:a", {}, "")  # revoked again, and the upstream cannot answer
        return kept, again, other, after, down

    kept, again, other, after, down = asyncio.run(main())
    assert kept == 2 and after == 3  # key:a asked again after its clear; key:b not
    assert isinstance(again, Allowed) and isinstance(other, Allowed)
    assert isinstance(down, Unverified) and down.status == 502


def test_a_check_waits_its_own_short_timeout_not_the_completions():
    async def main():
        up = FakeUpstream([200])
        up.release.set()
        await CredentialCheck(up, ttl=60, timeout=2.5).check("key:a", {}, "")
        return up.timeout

    assert asyncio.run(main()) == 2.5


def test_while_the_upstream_cannot_answer_a_known_verdict_is_extended_within_its_grace_only():
    """Extended ttl at a time, so one request per ttl waits on a check (at most its timeout)
    and the rest are answered from the kept verdict; past ttl + grace the key is refused with
    the upstream's failure, as a key never seen is."""
    now = [0.0]

    async def main():
        up = FakeUpstream([200, None, None, None])
        up.release.set()
        check = CredentialCheck(up, ttl=10, clock=lambda: now[0], grace=25)
        seen = [await check.check("key:a", {}, "")]
        for at in (11.0, 15.0, 22.0, 36.0):  # expired, then within the extension, then again, then past
            now[0] = at
            seen.append(await check.check("key:a", {}, ""))
        return seen, up.sent

    seen, sent = asyncio.run(main())
    assert [type(v).__name__ for v in seen] == ["Allowed", "Allowed", "Allowed", "Allowed", "Unverified"]
    assert sent == 4  # at 0, 11 (extended to 21), 22 (extended to 32: 10 + 25 caps it at 35), 36
    assert seen[-1].status == 502


def test_a_check_the_upstream_could_not_answer_is_remembered_for_the_checks_timeout():
    """A burst of requests with a key the upstream cannot vouch for costs one check, not one each."""
    now = [0.0]

    async def main():
        up = FakeUpstream([None, 200])
        up.release.set()
        check = CredentialCheck(up, ttl=60, clock=lambda: now[0], timeout=5)
        first = [await check.check("key:new", {}, "") for _ in range(3)]
        now[0] = 6.0  # past the check's timeout: asked again
        later = await check.check("key:new", {}, "")
        return first, later, up.sent

    first, later, sent = asyncio.run(main())
    assert all(isinstance(v, Unverified) for v in first) and isinstance(later, Allowed) and sent == 2


def test_new_keys_are_checked_within_a_bound_and_past_it_refused_at_once():
    """A flood of made-up keys would each be a request to the upstream: past max_checks in
    flight, a new key gets a 503 without one."""

    async def main():
        up = FakeUpstream([200, 200])
        check = CredentialCheck(up, ttl=60, max_checks=2)
        waiting = [asyncio.create_task(check.check(f"key:{n}", {}, "")) for n in range(2)]
        await asyncio.sleep(0)  # both checks are in flight (a scheduling point)
        refused = await check.check("key:2", {}, "")
        up.release.set()
        return await asyncio.gather(*waiting), refused, up.sent

    checked, refused, sent = asyncio.run(main())
    assert all(isinstance(v, Allowed) for v in checked) and sent == 2
    assert isinstance(refused, Unverified) and refused.status == 503


def test_a_hung_credential_check_holds_a_keys_hits_for_its_timeout_only(real_embedder):
    """/v1/models hangs: with a verdict expired, an exact hit waits auth_timeout, not the
    completions' upstream_timeout, and the kept verdict answers."""
    with (
        Served(make_upstream()) as upstream,
        served_proxy(upstream, real_embedder, auth_ttl=0, auth_timeout=0.5) as proxy,
    ):
        text = "When does the library open on Sundays?"
        assert chat(proxy, "sk-gina", text) == "miss"
        upstream.app.state.hang_checks = True
        assert chat(proxy, "sk-gina", text) == "exact"  # after 0.5 s, not 600


def test_an_upstream_that_accepts_a_key_it_never_issued_is_no_authority_on_keys():
    """The probe: a random key. A 2xx to it proves the upstream checks no keys at /v1/models, so
    every verdict after would be 'allowed': every key is refused instead, saying why."""

    async def main():
        up = FakeUpstream([200])
        up.release.set()
        up.probe_status = 200
        check = CredentialCheck(up, ttl=60)
        return await check.probe(), await check.check("key:a", {}, ""), up.sent

    authority, verdict, sent = asyncio.run(main())
    assert authority is False and isinstance(verdict, Unverified) and verdict.status == 503
    assert "--auth keys" in verdict.message and sent == 0  # the key itself was never asked about


def test_an_upstream_that_lost_its_standing_is_probed_again_once_a_ttl_and_regains_it():
    """A 2xx to the probe (a maintenance page, a misrouted deploy) refuses every key, but not
    for ever: once a ttl the probe is sent again, and a 401 to it serves keys once more."""
    now = [0.0]

    async def main():
        up = FakeUpstream([200, 200])
        up.release.set()
        up.probe_status = 200
        check = CredentialCheck(up, ttl=10, clock=lambda: now[0])
        lost = await check.check("key:a", {}, "")
        up.probe_status = 401  # the upstream is fixed
        now[0] = 5.0
        within = await check.check("key:a", {}, "")  # within the ttl: not asked again
        probed_within = up.probed
        now[0] = 10.0
        back = await check.check("key:a", {}, "")
        return lost, within, probed_within, back, up.probed, check.authority

    lost, within, probed_within, back, probed, authority = asyncio.run(main())
    assert isinstance(lost, Unverified) and lost.status == 503 and "--auth keys" in lost.message
    assert isinstance(within, Unverified) and within.status == 503 and probed_within == 1
    assert isinstance(back, Allowed) and probed == 2 and authority is True


def test_an_upstream_down_at_the_probe_is_probed_again_before_the_first_verdict():
    async def main():
        up = FakeUpstream([200])
        up.release.set()
        up.probe_status = None
        check = CredentialCheck(up, ttl=60)
        at_start = await check.probe()
        up.probe_status = 401
        verdict = await check.check("key:a", {}, "")
        return at_start, check.authority, verdict, up.probed

    at_start, authority, verdict, probed = asyncio.run(main())
    assert at_start is None and authority is True and isinstance(verdict, Allowed) and probed == 2


def test_gpucache_serve_refuses_to_start_with_auth_upstream_before_an_upstream_that_checks_no_keys(
    real_embedder,
):
    """llama.cpp's server answers /v1/models to anyone: behind it --auth upstream would let
    every key, revoked or made up, keep its hits for ever."""
    import subprocess
    import sys

    from serving import free_port

    with Served(make_upstream(public_models=True)) as upstream:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpucache",
                "serve",
                "--upstream",
                f"{upstream.url}/v1",
                "--port",
                str(free_port()),
                "--device",
                "cpu",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "GPUCACHE_NAMESPACE_SECRET": "a-secret-for-this-test"},
        )
        assert run.returncode == 2 and "Traceback" not in run.stderr
        assert "checks no keys there" in run.stderr and "--auth keys" in run.stderr
        assert len(upstream.app.state.probes) == 1 and upstream.app.state.calls == []
        # create_app refuses it too, for a caller that builds the app itself
        app = create_app(
            ServeSettings(upstream=f"{upstream.url}/v1", namespace_secret=SECRET),
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu"),
        )

        async def start() -> None:
            async with app.router.lifespan_context(app):
                pass

        with pytest.raises(ValueError, match="checks no keys there"):
            asyncio.run(start())


# ----------------------------------------------------------------------------- keyless clients


# every path a body can come on: a cached endpoint and one passed through uncached
BODY_PATHS = ["chat/completions", "embeddings"]


@pytest.mark.parametrize("path", BODY_PATHS)
def test_a_request_without_credentials_is_refused_by_default_before_its_body_is_read(real_embedder, path):
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder) as proxy:
        keyless = httpx.post(f"{proxy.url}/v1/{path}", content=b"{not json")
        # 401, not the 400 a malformed body would get: the body was never parsed
        assert keyless.status_code == 401 and keyless.json()["error"]["code"] == "missing_credentials"
        assert upstream.app.state.calls == [] and upstream.app.state.checks == []


def test_keyless_clients_let_in_are_checked_like_any_credential(real_embedder):
    settings = {"require_auth": False, "auth_ttl": 0}
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, **settings) as proxy:
        text = "What is on the shared team calendar?"

        def ask():
            return httpx.post(
                f"{proxy.url}/v1/chat/completions",
                json={"model": "smol", "messages": [{"role": "user", "content": text}]},
            )

        assert ask().headers["x-gpucache"] == "miss" and ask().headers["x-gpucache"] == "exact"
        assert upstream.app.state.checks == ["", ""]  # asked with no key, as the request came
        upstream.app.state.revoked.add("")  # an upstream that wants a key
        refused = ask()
        assert refused.status_code == 401 and refused.headers["x-gpucache"] == "refused"


@pytest.mark.parametrize("path", BODY_PATHS)
def test_a_refused_credential_is_answered_before_a_large_body_is_parsed(real_embedder, path):
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder) as proxy:
        upstream.app.state.revoked.add("sk-gone")
        big = b'{"model": "smol", "messages": [' + b'{"role": "user", "content": "x"},' * 100_000 + b"}"
        r = httpx.post(
            f"{proxy.url}/v1/{path}",
            content=big,
            headers={"authorization": "Bearer sk-gone", "content-type": "application/json"},
        )
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert upstream.app.state.calls == []


def test_a_large_body_is_parsed_off_the_event_loop(real_embedder, monkeypatch):
    import threading

    from gpucache.serve import intake as proxy_module

    threads = []
    keyed = proxy_module.keyed
    monkeypatch.setattr(
        proxy_module, "keyed", lambda *a: (threads.append(threading.current_thread()), keyed(*a))[1]
    )
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder) as proxy:
        c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-big", max_retries=0)
        for text in ("a short question", "a long question " + "with many words " * 8000):
            c.chat.completions.create(model="smol", messages=[{"role": "user", "content": text}])
    small, large = threads
    assert small is proxy.thread  # the server's event loop runs in this thread
    assert large is not proxy.thread  # the large body was parsed on a worker


# ----------------------------------------------------------------------------- auth = keys


def keys_proxy(upstream, real_embedder, path, **settings):
    return served_proxy(upstream, real_embedder, auth="keys", keys_file=str(path), **settings)


def test_with_auth_keys_only_listed_keys_are_served_and_the_upstream_is_never_asked(real_embedder, tmp_path):
    from gpucache.serve.keyfile import key_digest

    listed = tmp_path / "keys"
    listed.write_text(f"# team keys\nsk-erin\nsha256:{key_digest('sk-frank')}\n\n")
    with Served(make_upstream()) as upstream, keys_proxy(upstream, real_embedder, listed) as proxy:
        text = "Which keys may use this cache?"
        assert chat(proxy, "sk-erin", text) == "miss" and chat(proxy, "sk-erin", text) == "exact"
        assert chat(proxy, "sk-frank", text) == "miss"  # listed by its digest alone
        with pytest.raises(openai.AuthenticationError) as refused:
            chat(proxy, "sk-mallory", text)
        assert refused.value.body["code"] == "invalid_api_key"
        # one listed key cannot vouch for an unlisted one beside it
        both = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "smol", "messages": [{"role": "user", "content": text}]},
            headers={"authorization": "Bearer sk-erin", "x-api-key": "sk-mallory"},
        )
        assert both.status_code == 401
        assert upstream.app.state.checks == []


def test_the_key_file_is_read_again_when_it_changes_and_a_broken_edit_keeps_the_last_list(tmp_path):
    from gpucache.serve.auth import keys_verdict
    from gpucache.serve.keyfile import KeyFile

    path = tmp_path / "keys"
    path.write_text("sk-one\n")
    keys = KeyFile(str(path), recheck=0)

    def check(key):
        return asyncio.run(keys_verdict(keys, (f"Bearer {key}",)))

    def edit(text, stamp):
        path.write_text(text)
        os.utime(path, ns=(stamp, stamp))  # a distinct modification time, whatever the clock

    assert isinstance(check("sk-one"), Allowed) and isinstance(check("sk-two"), Denied)
    edit("sk-two\n", 10**18)
    assert isinstance(check("sk-two"), Allowed) and isinstance(check("sk-one"), Denied)
    edit("sha256:not-a-digest\n", 2 * 10**18)  # a broken edit: the last good list stands
    assert isinstance(check("sk-two"), Allowed) and keys.reloads == 1
    assert isinstance(asyncio.run(keys_verdict(keys, ("BEARER sk-two",))), Allowed)  # any case of the scheme


def test_auth_keys_needs_a_readable_key_file_at_start(tmp_path):
    with pytest.raises(ValueError, match="auth=keys needs keys_file"):
        ServeSettings(upstream="http://127.0.0.1:9/v1", auth="keys")
    with pytest.raises(ValueError, match="cannot be read"):
        create_app(
            ServeSettings(upstream="http://127.0.0.1:9/v1", auth="keys", keys_file=str(tmp_path / "absent"))
        )
    bad = tmp_path / "bad"
    bad.write_text("sha256:1234\n")
    with pytest.raises(ValueError, match="64 hex digits"):
        create_app(ServeSettings(upstream="http://127.0.0.1:9/v1", auth="keys", keys_file=str(bad)))


# ----------------------------------------------------------------------------- /admin/revoke

ADMIN = "admin-token-for-revoke-tests"


def test_admin_revoke_drops_every_scope_of_one_credential_and_its_verdict(real_embedder):
    with (
        Served(make_upstream()) as upstream,
        served_proxy(upstream, real_embedder, admin_token=ADMIN, auth_ttl=3600) as proxy,
    ):

        def ask(key, text, namespace=None, query=""):
            headers = {"authorization": f"Bearer {key}"}
            if namespace:
                headers["x-gpucache-namespace"] = namespace
            return httpx.post(
                f"{proxy.url}/v1/chat/completions?{query}",
                headers=headers,
                json={"model": "smol", "messages": [{"role": "user", "content": text}]},
            ).headers["x-gpucache"]

        text = "Summarise my private notes"
        scopes = [
            ("sk-leaked", None, ""),
            ("sk-leaked", "team-a", ""),
            ("sk-leaked", None, "api-version=1"),
            ("sk-other", None, ""),
        ]
        for key, namespace, query in scopes:
            assert ask(key, text, namespace, query) == "miss"
        assert upstream.app.state.checks.count("sk-leaked") == 1
        refused = httpx.post(
            f"{proxy.url}/admin/revoke", json={"credentials": {"authorization": "Bearer sk-leaked"}}
        )
        assert refused.status_code == 401  # the admin token is needed
        done = httpx.post(
            f"{proxy.url}/admin/revoke",
            headers={"authorization": f"bearer {ADMIN}"},
            json={"credentials": {"authorization": "Bearer sk-leaked"}},
        ).json()
        assert done["removed"] == 3 and done["revoked"].startswith("key:")
        assert ask("sk-other", text) == "exact"  # another key keeps its entries
        # every scope of the revoked key is empty, and its verdict was dropped: asked again at
        # once, not after auth_ttl (here the upstream still accepts it, and it starts afresh)
        for key, namespace, query in scopes[:3]:
            assert ask(key, text, namespace, query) == "miss"
        assert upstream.app.state.checks.count("sk-leaked") == 2
        nothing = httpx.post(
            f"{proxy.url}/admin/revoke",
            headers={"authorization": f"Bearer {ADMIN}"},
            json={"credentials": {}},
        )
        assert nothing.status_code == 400


def test_admin_revoke_by_a_bare_key_drops_it_in_every_header_and_parameter_form(real_embedder):
    with (
        Served(make_upstream()) as upstream,
        served_proxy(upstream, real_embedder, admin_token=ADMIN) as proxy,
    ):

        def ask(headers, query=""):
            return httpx.post(
                f"{proxy.url}/v1/chat/completions?{query}",
                headers=headers,
                json={"model": "smol", "messages": [{"role": "user", "content": "List my saved addresses"}]},
            ).headers["x-gpucache"]

        forms = [
            ({"authorization": "Bearer sk-leaked"}, ""),
            ({"authorization": "bearer sk-leaked"}, ""),
            ({"x-api-key": "sk-leaked"}, ""),
            ({"api-key": "sk-leaked"}, ""),
            ({}, "key=sk-leaked"),
            ({}, "api_key=sk-leaked"),
        ]
        kept = [({"x-api-key": "sk-other"}, ""), ({"authorization": "Bearer sk-leaked-too"}, "")]
        for headers, query in forms + kept:
            assert ask(headers, query) == "miss"
        admin = {"authorization": f"Bearer {ADMIN}"}
        done = httpx.post(f"{proxy.url}/admin/revoke", headers=admin, json={"key": "sk-leaked"}).json()
        assert done["removed"] == len(forms) and all(h.startswith("key:") for h in done["revoked"])
        for headers, query in kept:  # other keys, one of them sk-leaked's prefix, keep theirs
            assert ask(headers, query) == "exact"
        for headers, query in forms:
            assert ask(headers, query) == "miss"
        for bad in (
            {"key": ""},
            {"key": "  "},
            {"key": 7},
            {"key": None},
            {"key": "sk-other", "credentials": {"x-api-key": "sk-other"}},
            {"key": "sk-other", "query": ""},
        ):
            refused = httpx.post(f"{proxy.url}/admin/revoke", headers=admin, json=bad)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "key"


def test_health_says_ready_and_nothing_more_without_the_admin_token(real_embedder):
    with (
        Served(make_upstream()) as upstream,
        served_proxy(upstream, real_embedder, admin_token=ADMIN) as proxy,
    ):
        assert httpx.get(f"{proxy.url}/health").json() == {"status": "ok"}
        assert upstream.app.state.checks == []  # and the upstream was not called for it
        full = httpx.get(f"{proxy.url}/health", headers={"authorization": f"Bearer {ADMIN}"}).json()
        assert full["status"] == "ok" and full["upstream"] == "reachable" and "entries" in full


@pytest.mark.parametrize("path", BODY_PATHS)
def test_a_refused_request_with_a_large_unread_body_has_its_connection_closed(real_embedder, path):
    """Answered before its body was read, a request declaring megabytes is not kept alive: the
    proxy would otherwise read and discard every byte the refused client keeps sending."""
    import socket

    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
            sock.sendall(
                f"POST /v1/{path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n".encode()
                + b"content-length: 8000000\r\n\r\n"
                + b'{"model": "smol", "messages": ['
            )
            reply = b""
            while part := sock.recv(65536):  # until the proxy closes the connection
                reply += part
        head = reply.partition(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 401") and b"connection: close" in head
        # a small refused request keeps its connection for the next one
        with httpx.Client() as client:
            r = client.post(f"{proxy.url}/v1/chat/completions", json={"model": "smol", "messages": []})
            assert r.status_code == 401 and r.headers.get("connection") != "close"


def test_a_401_on_any_request_ends_the_kept_verdict_and_the_keys_hits_at_once(real_embedder):
    """The verdict kept from the last check would serve the key for up to auth_ttl more; the
    upstream refusing it on a miss drops that verdict, and the key's next request is checked
    again: refused there, it gets nothing more from the cache."""
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth_ttl=3600) as proxy:
        text = "What is the balance of my savings account?"
        assert chat(proxy, "sk-erin", text) == "miss"
        assert chat(proxy, "sk-erin", text) == "exact"
        upstream.app.state.revoked.add("sk-erin")
        with pytest.raises(openai.AuthenticationError):  # a new question: the upstream refuses it
            chat(proxy, "sk-erin", "And what about my checking account?")
        checks = upstream.app.state.checks.count("sk-erin")
        for ask in (lambda: chat(proxy, "sk-erin", text), lambda: chat(proxy, "sk-erin", text, stream=True)):
            with pytest.raises(openai.AuthenticationError) as refused:
                ask()
            assert refused.value.body["code"] == "invalid_api_key"
        assert upstream.app.state.checks.count("sk-erin") == checks + 1  # checked again once: refused
        assert chat(proxy, "sk-frank", text) == "miss"  # another key is unaffected


def test_a_key_file_of_keys_as_written_that_others_may_read_is_warned_about(tmp_path, caplog):
    from gpucache.serve.keyfile import KeyFile, key_digest

    path = tmp_path / "keys"
    path.write_text("sk-plain\n")
    path.chmod(0o644)
    with caplog.at_level("WARNING", logger="gpucache.serve"):
        KeyFile(str(path))
    assert "holds keys as written" in caplog.text
    caplog.clear()
    path.chmod(0o600)  # its owner's alone, or digests only: nothing to say
    KeyFile(str(path))
    path.write_text(f"# digests\nsha256:{key_digest('sk-plain')}\n")
    path.chmod(0o644)
    with caplog.at_level("WARNING", logger="gpucache.serve"):
        KeyFile(str(path))
    assert "holds keys as written" not in caplog.text


def test_a_gateways_refusal_of_one_model_does_not_lock_a_shared_key_out(real_embedder):
    """A gateway with per-key model lists answers 401 for a model the key may not use, and
    allows the key on GET /v1/models: one end user asking for that model gets the 401, and
    every other user of the key keeps its hits and its misses. The credential is checked again
    on its next request (one check more), not refused for the verdict's lifetime."""
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth_ttl=60) as proxy:
        text = "How do I export my calendar?"
        assert chat(proxy, "sk-shared", text) == "miss"
        checks = upstream.app.state.checks.count("sk-shared")
        c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-shared", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            c.chat.completions.create(model="forbidden-large", messages=[{"role": "user", "content": text}])
        assert refused.value.status_code == 401
        assert chat(proxy, "sk-shared", text) == "exact"  # another user of the key: served
        assert chat(proxy, "sk-shared", "How do I import a calendar?") == "miss"
        assert upstream.app.state.checks.count("sk-shared") == checks + 1  # checked again, once
        upstream.app.state.revoked.add("sk-shared")
        with pytest.raises(openai.AuthenticationError):  # a revoked key is refused by the check
            c.chat.completions.create(model="forbidden-large", messages=[{"role": "user", "content": text}])
        with pytest.raises(openai.AuthenticationError):
            chat(proxy, "sk-shared", text)


def test_a_valid_key_in_a_cookie_beside_a_revoked_one_serves_nothing(real_embedder):
    """The credential check sends the upstream the credential headers the tenant is hashed
    from and no other: a revoked key sent with a valid one in a cookie (which an upstream or
    gateway may read first) is checked alone, and refused."""
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder, auth_ttl=0) as proxy:
        c = openai.OpenAI(
            base_url=f"{proxy.url}/v1",
            api_key="sk-gone",
            max_retries=0,
            default_headers={"cookie": "session=sk-valid"},
        )
        messages = [{"role": "user", "content": "What is on my statement this month?"}]
        raw = c.chat.completions.with_raw_response.create(model="smol", messages=messages)
        assert raw.headers["x-gpucache"] == "miss"
        upstream.app.state.revoked.add("sk-gone")
        with pytest.raises(openai.AuthenticationError) as refused:
            c.chat.completions.create(model="smol", messages=messages)
        assert refused.value.status_code == 401


def test_a_credential_in_a_query_parameter_the_tenant_is_not_hashed_from_is_refused(real_embedder):
    with Served(make_upstream()) as upstream, served_proxy(upstream, real_embedder) as proxy:
        c = openai.OpenAI(
            base_url=f"{proxy.url}/v1", api_key="sk-gone", max_retries=0, default_query={"token": "sk-valid"}
        )
        with pytest.raises(openai.BadRequestError) as refused:
            c.chat.completions.create(
                model="smol", messages=[{"role": "user", "content": "Hello there, what is new?"}]
            )
        assert refused.value.body["code"] == "unhashed_credential"
        assert upstream.app.state.checks == [] and upstream.app.state.calls == []
