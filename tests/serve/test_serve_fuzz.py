"""Request bodies and headers a client can craft, generated: the proxy never answers with a
failure of its own (a 500 without the upstream behind it), and a request it refuses stores
nothing.

The proxy runs under a real uvicorn server in front of the stand-in upstream, with the
bag-of-words embedder (the fuzz is of the HTTP layer, not of meaning).
"""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from serving import Served, make_upstream  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.serve.app import create_app  # noqa: E402
from gpucache.serve.settings import ServeSettings  # noqa: E402

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
contents = (
    st.text(max_size=60)
    | values
    | st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", 3]), "text": scalars}),
        max_size=3,
    )
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", 5]), "content": contents}
    ),
    max_size=4,
)
known = st.fixed_dictionaries(
    {"model": st.sampled_from(["smol", "", 7, None]), "messages": messages | values},
    optional={
        "stream": st.booleans() | scalars,
        "n": scalars,
        "stream_options": values,
        "temperature": scalars,
        "tools": values,
        "logprobs": scalars,
        "prompt": values,
    },
)
# mostly well formed: the keying, the cache and the upstream all run on these
plausible = st.fixed_dictionaries(
    {
        "model": st.just("smol"),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": st.text(min_size=0, max_size=40)}),
            min_size=1,
            max_size=2,
        ),
    },
    optional={
        "stream": st.booleans(),
        "temperature": st.floats(0, 2),
        "seed": st.integers(0, 9),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "extra": values,
    },
)
bodies = (
    plausible.map(lambda body: json.dumps(body).encode())
    | known.map(lambda body: json.dumps(body).encode())
    | values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=80)
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "cache-control": st.sampled_from(
            [
                "no-cache",
                "no-store",
                "max-age=5",
                "max-age=-1",
                "max-age=x",
                "max-age=99999999999999999999",
                "private, max-age=0",
            ]
        ),
        "x-gpucache-namespace": st.sampled_from(["team-a", "a/b", "", "..", "x" * 200]),
        "authorization": st.sampled_from(["Bearer k", "", "Bearer other"]),
        "api-key": st.sampled_from(["k1", "k2"]),
    },
)


@pytest.fixture(scope="module")
def proxy():
    from conftest import FakeEmbedder

    with Served(make_upstream()) as upstream:
        config = ServeSettings(
            upstream=f"{upstream.url}/v1",
            namespace_secret=b"fuzz-secret-of-some-length",
            admin_token="fuzz-admin-token-0123",
        )
        app = create_app(config, cache_factory=lambda: SemanticCache(FakeEmbedder(), device="cpu"))
        with Served(app) as served:
            yield served


def entries(proxy) -> int:
    return httpx.get(
        f"{proxy.url}/admin/stats", headers={"authorization": "Bearer fuzz-admin-token-0123"}
    ).json()["entries"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, extra=headers, endpoint=st.sampled_from(["chat/completions", "completions"]))
def test_no_crafted_request_fails_the_proxy_or_stores_when_refused(proxy, body, extra, endpoint):
    before = entries(proxy)
    response = httpx.post(
        f"{proxy.url}/v1/{endpoint}",
        content=body,
        timeout=60,
        headers={"content-type": "application/json", **extra},
    )
    hypothesis.event(f"{response.status_code} {response.headers.get('x-gpucache', 'refused')}")
    if response.status_code >= 500:
        # only the upstream's own failure (passed through, marked) or an unreachable upstream
        assert "x-gpucache" in response.headers or response.status_code in (502, 504), response.text
    if 400 <= response.status_code < 500 and "x-gpucache" not in response.headers:
        assert response.json()["error"]["message"]  # an OpenAI-shaped refusal
        assert entries(proxy) == before
