"""A conversation is one value the cache keys: its request alone where there is no context, and
otherwise a key no text prompt can collide with, from which the conversation is read back."""

from __future__ import annotations

import pytest

from gpucache import Conversation, Turn
from gpucache.cache.validation import check_prompt
from gpucache.conversation.value import MARK, decode, given, request_of

GREETED = Conversation(
    "which of those ships fastest?",
    (
        Turn("user", "looking for a standing desk under 400"),
        Turn("assistant", "The Flexispot E5 ($329) and the Uplift V2 ($399) both fit."),
    ),
)


def test_a_conversation_without_context_is_keyed_as_its_request():
    assert Conversation("what time is checkout?").key == "what time is checkout?"


def test_a_conversation_with_context_is_keyed_whole_and_read_back_equal():
    key = GREETED.key
    assert key.startswith(MARK) and "Flexispot" in key
    assert decode(key) == GREETED and given(key) == GREETED
    assert request_of(key) == "which of those ships fastest?"
    assert given("plain text") == "plain text"


def test_two_conversations_differing_in_one_turn_have_different_keys():
    other = Conversation(GREETED.request, (GREETED.context[0], Turn("assistant", "The Uplift V2 fits.")))
    assert other.key != GREETED.key


def test_from_messages_takes_user_and_assistant_turns_and_ends_on_the_users():
    conversation = Conversation.from_messages(
        [
            {"role": "user", "content": "looking for a standing desk under 400"},
            {"role": "assistant", "content": "The Flexispot E5 ($329) and the Uplift V2 ($399) both fit."},
            {"role": "user", "content": "which of those ships fastest?"},
        ]
    )
    assert conversation == GREETED
    with pytest.raises(ValueError, match="system prompts go in the scope"):
        Conversation.from_messages(
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        )
    with pytest.raises(ValueError, match="last message must be the user's"):
        Conversation.from_messages([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    with pytest.raises(ValueError, match="at least one"):
        Conversation.from_messages([])


@pytest.mark.parametrize(
    "bad, error",
    [
        (lambda: Turn("tool", "x"), ValueError),
        (lambda: Turn("user", 3), TypeError),
        (lambda: Conversation(None), TypeError),  # type: ignore[arg-type]
        (lambda: Conversation("q", "not turns"), TypeError),  # type: ignore[arg-type]
        (lambda: Conversation("q", ({"role": "user"},)), TypeError),  # type: ignore[arg-type]
    ],
)
def test_malformed_turns_and_conversations_are_refused_when_built(bad, error):
    with pytest.raises(error):
        bad()


def test_the_cache_refuses_a_text_prompt_that_imitates_a_conversation_key():
    assert check_prompt(GREETED) == GREETED.key
    with pytest.raises(ValueError, match="conversation marker"):
        check_prompt(GREETED.key)
    with pytest.raises(ValueError, match="empty"):
        check_prompt(Conversation("   ", GREETED.context))
