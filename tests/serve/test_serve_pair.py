"""``gpucache serve --decision pair`` through the official ``openai`` client: the cache built from
the settings as the command builds it (the packaged embedder, the shipped pair model on the
embedder's device), the named rules refusing first, the pair model lifting a soft rule's refusal
past its cut and refusing below its other cut what the rules let through, each refusal named in
``x-gpucache-refused`` and counted under its rule."""

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
            guard=GuardSettings(decision="pair"),
        )
        with Served(create_app(config)) as served:
            yield served


def ask(proxy, text: str):
    c = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="k",
        max_retries=0,
        default_headers={"x-gpucache-namespace": "t-pair"},
    )
    raw = c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}]
    )
    return raw.headers, raw.parse().choices[0].message.content


def test_the_pair_decision_lifts_a_shape_refusal_refuses_what_the_rules_let_through_and_names_it(proxy):
    ask(proxy, "why does my dog chew his paws")
    headers, answer = ask(proxy, "why does my doggo chew his paws")  # the rules: substitution
    assert headers["x-gpucache"] == "semantic" and answer == answer_to("why does my dog chew his paws")

    ask(proxy, "Can I run a marathon on a vegan diet?")
    headers, answer = ask(proxy, "Can I run a marathon without a vegan diet?")  # the rules let it through
    assert headers["x-gpucache"] == "miss" and headers["x-gpucache-refused"] == "pair"
    assert answer == answer_to("Can I run a marathon without a vegan diet?")

    ask(proxy, "Convert 26 miles to km")
    headers, _ = ask(proxy, "Convert 26 km to miles")  # a named rule, before the model
    assert headers["x-gpucache"] == "miss" and headers["x-gpucache-refused"] == "direction"

    metrics = httpx.get(f"{proxy.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    assert 'gpucache_verifier_rejections_total{rule="pair"} 1.0' in metrics
    assert 'gpucache_verifier_rejections_total{rule="direction"} 1.0' in metrics
