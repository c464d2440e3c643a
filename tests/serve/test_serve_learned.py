"""``gpucache serve --decision learned`` through the official ``openai`` client: the cache built
from the settings as the command builds it (the packaged model), the named rules refusing
first, the learned score deciding the rest, and each refusal named in ``x-gpucache-refused``
and counted under its rule."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from serving import Served, answer_to, make_upstream  # noqa: E402

from gpucache.guard.settings import GuardSettings  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402

ADMIN = "admin-secret-for-the-tests"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with Served(make_upstream()) as upstream:
        config = ServeSettings(
            upstream=f"{upstream.url}/v1",
            admin_token=ADMIN,
            require_auth=False,
            namespace_secret=b"tenancy-secret-for-the-tests",
            snapshot=str(tmp_path_factory.mktemp("snap") / "c.gpucache"),
            guard=GuardSettings(decision="learned"),
        )
        with Served(create_app(config)) as served:
            yield served


def ask(proxy, text: str):
    c = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="k",
        max_retries=0,
        default_headers={"x-gpucache-namespace": "t-learned"},
    )
    raw = c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}]
    )
    return raw.headers, raw.parse().choices[0].message.content


def test_the_learned_decision_serves_rewordings_and_names_what_it_refuses(proxy):
    ask(proxy, "How do I reset my password?")
    headers, answer = ask(proxy, "hey, quick question, how can I reset my password? thanks!")
    assert headers["x-gpucache"] == "semantic" and answer == answer_to("How do I reset my password?")

    ask(proxy, "Summarize the plot of Hamlet")
    headers, answer = ask(proxy, "Summarize the themes of Hamlet")  # 0.92 alike: the score refuses
    assert headers["x-gpucache"] == "miss" and headers["x-gpucache-refused"] == "score"
    assert answer == answer_to("Summarize the themes of Hamlet")

    ask(proxy, "Convert 26 miles to km")
    headers, _ = ask(proxy, "Convert 26 km to miles")  # a named rule, before any score
    assert headers["x-gpucache"] == "miss" and headers["x-gpucache-refused"] == "direction"

    metrics = httpx.get(f"{proxy.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    assert 'gpucache_verifier_rejections_total{rule="score"} 1.0' in metrics
    assert 'gpucache_verifier_rejections_total{rule="direction"} 1.0' in metrics
