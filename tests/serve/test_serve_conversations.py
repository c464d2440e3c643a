"""Conversations through ``gpucache serve`` and the official ``openai`` client.

With the cache's defaults (``match_context`` off) a conversation is served by meaning only after
the same earlier turns, word for word: every conversation that leaked one end user's answer to
another through a shared key (tests/conversation_leaks.py) is a miss. With the context matcher
on, those are misses too, and a follow-up is served after a conversation whose earlier turns
differ only in what is shown not to matter (an opening greeting), never after one that differs
in anything else. One case per kind of the
conversation pairs (data/SOURCES.md); each kind's check is shown to matter, with the check taken
out, in tests/conversation/test_context.py.
"""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from conversation_leaks import LEAKS, chat  # noqa: E402
from serving import Served, answer_to, keyless_proxy, make_upstream  # noqa: E402


def _serving(embedder, tmp_path_factory, **cache):
    snapshot = str(tmp_path_factory.mktemp("snap") / "c.gpucache")
    with Served(make_upstream()) as upstream:
        app = keyless_proxy(
            f"{upstream.url}/v1",
            embedder,
            snapshot,
            "admin-secret-for-the-tests",
            b"tenancy-secret-for-the-tests",
            **cache,
        )
        with Served(app) as served:
            yield served


@pytest.fixture(scope="module")
def proxy(real_embedder, tmp_path_factory):
    """The proxy, with the cache's defaults, before a stand-in upstream of its own."""
    yield from _serving(real_embedder, tmp_path_factory)


@pytest.fixture(scope="module")
def matching(real_embedder, tmp_path_factory):
    """The proxy with the context matcher on (``match_context``)."""
    yield from _serving(real_embedder, tmp_path_factory, match_context=True)


BOOKED = (
    "I need to book a dentist cleaning at the Elm Street clinic on Friday",
    "Done: Friday at 9:00 at Elm Street.",
)
MOVE = "can you move it to the afternoon?"
KETTLE = "so what should I check first?"
ROAMING = ("which of your plans includes roaming?", "The Traveller plan includes roaming in 40 countries.")

# (kind, the conversation stored, the one asked after it)
SHARED = [
    ("greeting", chat(*BOOKED, MOVE), chat("hello!", "Hi, how can I help?", *BOOKED, MOVE)),
    ("greeting_first", chat(*BOOKED, MOVE), chat("Hi! " + BOOKED[0], BOOKED[1], MOVE)),
]
REFUSED = [
    (
        "unrelated_turns",
        chat(*BOOKED, MOVE),
        chat("do you take Visa cards?", "Yes, every major card.", *BOOKED, MOVE),
    ),
    (
        "self_contained",
        chat("hi", "Hello!", "what is the boiling point of ethanol?"),
        chat("my chemistry quiz is tomorrow", "Good luck!", "what is the boiling point of ethanol?"),
    ),
    (
        "entity",
        chat(*BOOKED, MOVE),
        chat(
            "I need to book a dentist cleaning at the Oak Avenue clinic on Friday",
            "Done: Friday at 9:00 at Oak Avenue.",
            MOVE,
        ),
    ),
    ("number", chat(*BOOKED, MOVE), chat(BOOKED[0], "Done: Friday at 11:00 at Elm Street.", MOVE)),
    (
        "detail",
        chat("my car makes a rattle when I brake", "At any speed?", "where is the rattle coming from?"),
        chat("my car makes a rattle when I speed up", "At any speed?", "where is the rattle coming from?"),
    ),
    (
        "change_of_mind",
        chat(*BOOKED, MOVE),
        chat(*BOOKED, "haha actually make it a whitening", "Sure.", MOVE),
    ),
    (
        "assistant_fact",
        chat(*ROAMING, "how much is it per month?"),
        chat(ROAMING[0], "The Basic plan includes roaming in 40 countries.", "how much is it per month?"),
    ),
    (
        "referent",
        chat(
            "my son has a cold and my wife has the flu",
            "Sorry to hear that.",
            "is the second one contagious?",
        ),
        chat(
            "my wife has the flu and my son has a cold",
            "Sorry to hear that.",
            "is the second one contagious?",
        ),
    ),
]


def client(proxy, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="k",
        max_retries=0,
        default_headers={"x-gpucache-namespace": tenant},
    )


def outcome(proxy, tenant: str, stored: list[dict[str, str]], asked: list[dict[str, str]]) -> tuple[str, str]:
    """The cache's answer to ``asked`` after ``stored`` (a miss, answered upstream), in a tenant of
    its own: its ``x-gpucache`` header and the text served."""
    c = client(proxy, tenant)
    first = c.chat.completions.with_raw_response.create(model="smol", messages=stored)
    assert first.headers["x-gpucache"] == "miss"
    raw = c.chat.completions.with_raw_response.create(model="smol", messages=asked)
    return raw.headers["x-gpucache"], raw.parse().choices[0].message.content


@pytest.mark.parametrize("served_by", ["proxy", "matching"])
@pytest.mark.parametrize("kind, stored, asked", LEAKS, ids=[k for k, _, _ in LEAKS])
def test_no_conversation_that_leaked_is_served_by_default_or_with_the_matcher_on(
    request, served_by, kind, stored, asked
):
    tier, _ = outcome(request.getfixturevalue(served_by), f"t-leak-{served_by}-{kind}", stored, asked)
    assert tier == "miss"


@pytest.mark.parametrize("kind, stored, asked", SHARED, ids=[k for k, _, _ in SHARED])
def test_by_default_a_follow_up_after_other_turns_is_a_miss_and_after_the_same_turns_a_hit(
    proxy, kind, stored, asked
):
    tier, _ = outcome(proxy, f"t-default-{kind}", stored, asked)
    assert tier == "miss"
    reworded = [*stored[:-1], {"role": "user", "content": stored[-1]["content"].rstrip("?!. ") + ", please?"}]
    raw = client(proxy, f"t-default-{kind}").chat.completions.with_raw_response.create(
        model="smol", messages=reworded
    )
    assert raw.headers["x-gpucache"] == "semantic"
    assert raw.parse().choices[0].message.content == answer_to(stored[-1]["content"])


@pytest.mark.parametrize("kind, stored, asked", SHARED, ids=[k for k, _, _ in SHARED])
def test_a_follow_up_is_served_after_turns_that_differ_only_in_what_it_does_not_depend_on(
    matching, kind, stored, asked
):
    tier, text = outcome(matching, f"t-shared-{kind}", stored, asked)
    assert tier == "semantic" and text == answer_to(stored[-1]["content"])


@pytest.mark.parametrize("kind, stored, asked", REFUSED, ids=[k for k, _, _ in REFUSED])
def test_a_follow_up_is_never_served_after_turns_that_differ_in_what_it_depends_on(
    matching, kind, stored, asked
):
    tier, _ = outcome(matching, f"t-refused-{kind}", stored, asked)
    assert tier == "miss"
