"""The context matcher serves a conversation's answer after another conversation only where their
earlier turns agree on everything the final request depends on: reworded turns, chatter and
turns about something else do not block a hit; a differing detail, a change of mind or a fact the
assistant stated differently does. Each case below fails when its check is taken out."""

from __future__ import annotations

import pytest

from gpucache import ContextMatcher, Conversation, Turn
from gpucache.conversation import context


def talk(request: str, *turns: str) -> Conversation:
    """A conversation from alternating user and assistant texts, then the final request."""
    roles = ("user", "assistant")
    return Conversation(request, tuple(Turn(roles[i % 2], t) for i, t in enumerate(turns)))


@pytest.fixture(scope="module")
def matcher() -> ContextMatcher:
    return ContextMatcher()


BOOKED = talk("can you move it to the afternoon?",
              "I need to book a dentist cleaning at the Elm Street clinic on Friday",
              "Done: Friday at 9:00 at Elm Street.")


def test_the_same_context_agrees(matcher):
    assert matcher.explain(BOOKED, BOOKED).rule == "context-same"


def test_reworded_turns_and_chatter_do_not_block_a_hit(matcher):
    reworded = talk("can you move it to the afternoon?",
                    "hello!", "Hi, how can I help?",
                    "i need to book a dentist cleaning at the Elm Street clinic on friday",
                    "Done: Friday at 9:00 at Elm Street.")
    assert not matcher.explain(BOOKED, reworded).rejected


def test_a_turn_about_something_else_does_not_block_a_hit(matcher):
    detour = talk("can you move it to the afternoon?",
                  "do you take Visa cards?", "Yes, every major card.",
                  "I need to book a dentist cleaning at the Elm Street clinic on Friday",
                  "Done: Friday at 9:00 at Elm Street.")
    assert not matcher.explain(BOOKED, detour).rejected


@pytest.mark.parametrize("changed, what", [
    (talk("can you move it to the afternoon?",
          "I need to book a dentist cleaning at the Oak Avenue clinic on Friday",
          "Done: Friday at 9:00 at Oak Avenue."), "another place"),
    (talk("can you move it to the afternoon?",
          "I need to book a dentist cleaning at the Elm Street clinic on Friday",
          "Done: Friday at 11:00 at Elm Street."), "another time the assistant stated"),
])
def test_a_differing_detail_the_request_depends_on_refuses(matcher, changed, what):
    verdict = matcher.explain(BOOKED, changed)
    assert verdict.rejected and verdict.rule == "context-detail", what


def test_a_change_of_mind_refuses(matcher):
    changed = talk("can you move it to the afternoon?",
                   "I need to book a dentist cleaning at the Elm Street clinic on Friday",
                   "Done: Friday at 9:00 at Elm Street.",
                   "actually cancel the cleaning and book a filling instead",
                   "Done: Friday at 9:00 at Elm Street.")
    verdict = matcher.explain(BOOKED, changed)
    assert verdict.rejected and "turn 3" in verdict.detail


def test_a_request_that_points_back_needs_the_turn_it_points_to(matcher):
    verdict = matcher.explain(BOOKED, talk("can you move it to the afternoon?"))
    assert verdict.rejected


def test_a_request_that_stands_alone_is_served_whatever_came_before(matcher):
    alone = "what are the opening hours of the Elm Street clinic"
    asked = talk(alone, "do you take Visa cards?", "Yes, every major card.")
    assert not matcher.explain(asked, talk(alone, "is parking free?", "Yes, behind the building.")).rejected


def test_taking_out_the_detail_check_serves_the_other_place(matcher, monkeypatch):
    """The detail check is what refuses another clinic: without it the matcher would serve."""
    changed = talk("can you move it to the afternoon?",
                   "I need to book a dentist cleaning at the Oak Avenue clinic on Friday",
                   "Done: Friday at 9:00 at Oak Avenue.")
    monkeypatch.setattr(context, "_differing", lambda a, b: [])
    verdict = matcher.explain(BOOKED, changed)
    assert verdict.rule != "context-detail"


def test_taking_out_the_latest_exchange_rule_serves_a_follow_up_without_its_referent(matcher, monkeypatch):
    monkeypatch.setattr(context, "points_back", lambda request: False)
    assert not matcher.explain(BOOKED, talk("can you move it to the afternoon?")).rejected


def test_the_verdicts_are_the_same_in_every_process():
    from conftest import outputs_under_hash_seeds

    code = """
from gpucache import ContextMatcher, Conversation, Turn
a = Conversation("how long is the battery warranty on it?", (
    Turn("user", "I bought a Corolla hybrid in 2021"), Turn("assistant", "Nice car."),
    Turn("user", "also what's your phone number"), Turn("assistant", "555-0100.")))
b = Conversation("how long is the battery warranty on it?", (
    Turn("user", "hey"), Turn("assistant", "Hello!"),
    Turn("user", "i got a corolla hybrid back in 2021"), Turn("assistant", "Nice car.")))
c = Conversation("how long is the battery warranty on it?", (
    Turn("user", "I bought a Camry hybrid in 2021"), Turn("assistant", "Nice car.")))
m = ContextMatcher()
print(m.explain(a, b), m.explain(a, c), m.explain(b, c))
"""
    outputs = outputs_under_hash_seeds(code)
    assert len(outputs) == 1, outputs


def test_a_conversation_longer_than_the_bound_is_matched_exactly_only(matcher):
    long = BOOKED.context * (context.MAX_CONTEXT_TURNS // 2 + 1)
    verdict = matcher.explain(Conversation(BOOKED.request, long), Conversation(BOOKED.request, long[2:]))
    assert verdict.rejected and verdict.rule == "context-too-long"
