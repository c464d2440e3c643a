"""``gpucache serve`` under more requests than it takes at once (``max_concurrency``): the
request past the bound is shed at once with 503 and Retry-After, counted, and sends nothing
upstream; an exact repeat is still answered from the cache while the bound is full; once the
held requests finish, requests are taken again. Driven by a real server and the official
client, with the stand-in upstream holding its answers until released (an event, no sleep)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402
from serving import Served, answer_to, make_upstream  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402


def ask(url, text, retries=0):
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=retries)
    return c.chat.completions.with_raw_response.create(model="smol", messages=[{"role": "user", "content": text}])


def test_past_max_concurrency_requests_are_shed_and_repeats_still_served(real_embedder):
    with Served(make_upstream()) as upstream:
        config = ServeSettings(upstream=f"{upstream.url}/v1", max_concurrency=2, retry_after=3)
        app = create_app(config, cache_factory=lambda: SemanticCache(
            real_embedder, device="cpu", lookup_timeout_seconds=30.0))
        with Served(app) as proxy:
            repeat = "What is the capital of Portugal?"
            assert ask(proxy.url, repeat).headers["x-gpucache"] == "miss"
            held = ["[drip] Tell me about the first held request", "[drip] Tell me about the second held one"]
            answers: dict[str, str] = {}
            threads = [threading.Thread(target=lambda t=t: answers.update({t: ask(proxy.url, t).parse()
                                                                            .choices[0].message.content}))
                       for t in held]
            for t in threads:
                t.start()
            arrived = upstream.app.state.arrived
            with arrived:  # both held requests have reached the upstream: the bound is full
                assert arrived.wait_for(lambda: len(upstream.app.state.calls) == 3, timeout=60)

            with pytest.raises(openai.APIStatusError) as shed:
                ask(proxy.url, "A third question, while the proxy is full")
            assert shed.value.status_code == 503
            assert shed.value.response.headers["retry-after"] == "3"
            assert shed.value.response.headers["x-should-retry"] == "true"
            assert shed.value.body["code"] == "overloaded"
            assert len(upstream.app.state.calls) == 3  # the shed request went nowhere

            served = ask(proxy.url, repeat)  # an exact repeat takes no slot
            assert served.headers["x-gpucache"] == "exact"
            assert served.parse().choices[0].message.content == answer_to(repeat)

            httpx.post(f"{upstream.url}/control/drip")
            for t in threads:
                t.join(60)
            assert answers == {t: answer_to(t) for t in held}
            assert ask(proxy.url, "A third question, now that there is room").headers["x-gpucache"] == "miss"
            metrics = httpx.get(f"{proxy.url}/metrics").text
            assert 'gpucache_errors_total{kind="shed"} 1.0' in metrics
            assert 'gpucache_requests_total{endpoint="chat/completions",outcome="shed"} 1.0' in metrics
