"""The guard's other decisions through ``gpucache serve`` and the official ``openai`` client: the
cache built from the settings as the command builds it (the packaged embedder; for the pair
decision the shipped pair model on the embedder's device), the named rules refusing first, the
decision deciding the rest, each refusal named in ``x-gpucache-refused`` and counted under its
rule. ``--decision learned``: the learned score; ``--decision pair``: the pair model lifting a
soft rule's refusal past its cut and refusing below its other cut what the rules let through."""

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
def proxy(request, tmp_path_factory):
    with Served(make_upstream()) as upstream:
        config = ServeSettings(
            upstream=f"{upstream.url}/v1",
            admin_token=ADMIN,
            require_auth=False,
            namespace_secret=b"tenancy-secret-for-the-tests",
            snapshot=str(tmp_path_factory.mktemp("snap") / "c.gpucache"),
            guard=GuardSettings(decision=request.param),
        )
        with Served(create_app(config)) as served:
            yield served


def ask(proxy, text: str):
    c = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="k",
        max_retries=0,
        default_headers={"x-gpucache-namespace": "t-decision"},
    )
    raw = c.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": text}]
    )
    return raw.headers, raw.parse().choices[0].message.content


def counted(proxy, rule: str) -> bool:
    metrics = httpx.get(f"{proxy.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    return f'gpucache_verifier_rejections_total{{rule="{rule}"}} 1.0' in metrics


@pytest.mark.parametrize("proxy", ["learned", "pair"], indirect=True)
def test_a_named_rule_refuses_before_the_decision(proxy):
    ask(proxy, "Convert 26 miles to km")
    headers, _ = ask(proxy, "Convert 26 km to miles")
    assert headers["x-gpucache"] == "miss" and headers["x-gpucache-refused"] == "direction"
    assert counted(proxy, "direction")


@pytest.mark.parametrize("proxy", ["learned"], indirect=True)
def test_the_learned_decision_serves_rewordings_and_names_what_it_refuses(proxy):
    ask(proxy, "How do I reset my password?")
    headers, answer = ask(proxy, "hey, quick question, how can I reset my password? thanks!")
    assert headers["x-gpucache"] == "semantic" and answer == answer_to("How do I reset my password?")

    ask(proxy, "Summarize the plot of Hamlet")
    headers, answer = ask(proxy, "Summarize the themes of Hamlet")  # 0.92 alike: the score refuses
    assert headers["x-gpucache"] == "miss" and headers["x-gpucache-refused"] == "score"
    assert answer == answer_to("Summarize the themes of Hamlet")
    assert counted(proxy, "score")


@pytest.mark.parametrize("proxy", ["pair"], indirect=True)
def test_the_pair_decision_lifts_a_shape_refusal_and_refuses_what_the_rules_let_through(proxy):
    ask(proxy, "why does my dog chew his paws")
    headers, answer = ask(proxy, "why does my doggo chew his paws")  # the rules: substitution
    assert headers["x-gpucache"] == "semantic" and answer == answer_to("why does my dog chew his paws")

    ask(proxy, "Can I run a marathon on a vegan diet?")
    headers, answer = ask(proxy, "Can I run a marathon without a vegan diet?")  # the rules let it through
    assert headers["x-gpucache"] == "miss" and headers["x-gpucache-refused"] == "pair"
    assert answer == answer_to("Can I run a marathon without a vegan diet?")
    assert counted(proxy, "pair")
