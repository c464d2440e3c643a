"""Conversations through a real cache (the packaged embedder): a conversation goes wherever a
prompt goes, the exact tier is exact on the whole of it, and the semantic tier serves it after a
conversation whose context agrees and refuses it after one that differs."""

from __future__ import annotations

import asyncio

import pytest

from gpucache import Conversation, SemanticCache, Turn


def talk(request: str, *turns: str) -> Conversation:
    roles = ("user", "assistant")
    return Conversation(request, tuple(Turn(roles[i % 2], t) for i, t in enumerate(turns)))


STORED = talk(
    "how much would that cost per month?",
    "which of your plans includes international roaming?",
    "The Traveller plan includes roaming in 40 countries.",
)


@pytest.fixture
def cache(real_embedder) -> SemanticCache:
    made = SemanticCache(real_embedder, device="cpu", match_context=True)
    made.put(STORED, "The Traveller plan is $45 a month.")
    return made


def test_by_default_earlier_turns_must_be_the_same_word_for_word(real_embedder):
    """``match_context`` off, the default: the final request is matched by meaning, after the
    same earlier turns only."""
    cache = SemanticCache(real_embedder, device="cpu")
    cache.put(STORED, "The Traveller plan is $45 a month.")
    reworded_final = Conversation("what would that cost monthly?", STORED.context)
    hit = cache.get(reworded_final)
    assert hit is not None and not hit.exact
    chatty = Conversation(
        STORED.request, (Turn("user", "hi there"), Turn("assistant", "Hello!"), *STORED.context)
    )
    assert cache.get(chatty) is None
    assert cache.stats().rejections.get("context-differs") == 1


def test_the_exact_conversation_is_an_exact_hit(cache):
    hit = cache.get(STORED)
    assert hit is not None and hit.exact and hit.cached_prompt == STORED


def test_a_conversation_opened_with_a_greeting_is_a_semantic_hit(cache):
    asked = talk(
        "how much would that cost per month?",
        "hi there",
        "Hello! How can I help?",
        "which of your plans includes international roaming?",
        "The Traveller plan includes roaming in 40 countries.",
    )
    hit = cache.get(asked)
    assert hit is not None and not hit.exact and hit.cached_prompt == STORED


def test_a_conversation_about_another_plan_is_refused_and_counted(cache):
    asked = talk(
        "how much would that cost per month?",
        "which of your plans includes unlimited data?",
        "The Streamer plan includes unlimited data.",
    )
    assert cache.get(asked) is None
    assert any(rule.startswith("context-") for rule in cache.stats().rejections)


def test_the_same_follow_up_without_its_context_is_refused(cache):
    assert cache.get("how much would that cost per month?") is None


def test_the_loader_is_handed_the_conversation_it_was_asked(cache):
    asked = talk(
        "and how do I switch to it?",
        "which of your plans includes international roaming?",
        "The Traveller plan includes roaming in 40 countries.",
    )
    seen = []
    answer = cache.get_or_put(asked, lambda c: seen.append(c) or "From the app, under Plans.")
    assert seen == [asked] and answer == "From the app, under Plans."
    assert cache.get(asked).exact

    async def batch(missed):
        seen.append(missed)
        return ["one", "two"]

    other = talk("is there a contract?", *[t.text for t in asked.context])
    assert asyncio.run(cache.aget_or_put_all([other, "what is roaming?"], batch)) == ["one", "two"]
    assert seen[-1] == [other, "what is roaming?"]


def test_invalidate_removes_the_conversation_only(cache):
    cache.put("how much would that cost per month?", "It depends on the plan.")
    assert cache.invalidate(STORED)
    assert cache.get(STORED) is None or not cache.get(STORED).exact
    assert cache.get("how much would that cost per month?").exact


def test_a_conversation_survives_a_snapshot_and_is_matched_the_same_after_it(cache, real_embedder, tmp_path):
    path = tmp_path / "c.gpucache"
    cache.save(path)
    loaded = SemanticCache.load(path, embedder=real_embedder, device="cpu", match_context=True)
    hit = loaded.get(STORED)
    assert hit is not None and hit.exact and hit.cached_prompt == STORED
    other_plan = talk(
        "how much would that cost per month?",
        "which of your plans includes unlimited data?",
        "The Streamer plan includes unlimited data.",
    )
    assert loaded.get(other_plan) is None
