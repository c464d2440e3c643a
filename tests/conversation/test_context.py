"""The context matcher serves a conversation's answer after another conversation only where their
earlier turns agree on everything the final request depends on: reworded turns, chatter and
turns about something else do not block a hit; a differing detail, a change of mind or a fact the
assistant stated differently does. Each case below fails when its check is taken out."""

from __future__ import annotations

import re

import pytest

from gpucache import ContextMatcher, Conversation, Turn
from gpucache.conversation import context, reading


def talk(request: str, *turns: str) -> Conversation:
    """A conversation from alternating user and assistant texts, then the final request."""
    roles = ("user", "assistant")
    return Conversation(request, tuple(Turn(roles[i % 2], t) for i, t in enumerate(turns)))


@pytest.fixture(scope="module")
def matcher() -> ContextMatcher:
    return ContextMatcher()


BOOKED = talk(
    "can you move it to the afternoon?",
    "I need to book a dentist cleaning at the Elm Street clinic on Friday",
    "Done: Friday at 9:00 at Elm Street.",
)


def test_the_same_context_agrees(matcher):
    assert matcher.explain(BOOKED, BOOKED).rule == "context-same"


def test_reworded_turns_and_chatter_do_not_block_a_hit(matcher):
    reworded = talk(
        "can you move it to the afternoon?",
        "hello!",
        "Hi, how can I help?",
        "i need to book a dentist cleaning at the Elm Street clinic on friday",
        "Done: Friday at 9:00 at Elm Street.",
    )
    assert not matcher.explain(BOOKED, reworded).rejected


def test_a_turn_about_something_else_does_not_block_a_hit(matcher):
    detour = talk(
        "can you move it to the afternoon?",
        "do you take Visa cards?",
        "Yes, every major card.",
        "I need to book a dentist cleaning at the Elm Street clinic on Friday",
        "Done: Friday at 9:00 at Elm Street.",
    )
    assert not matcher.explain(BOOKED, detour).rejected


@pytest.mark.parametrize(
    "changed, what",
    [
        (
            talk(
                "can you move it to the afternoon?",
                "I need to book a dentist cleaning at the Oak Avenue clinic on Friday",
                "Done: Friday at 9:00 at Oak Avenue.",
            ),
            "another place",
        ),
        (
            talk(
                "can you move it to the afternoon?",
                "I need to book a dentist cleaning at the Elm Street clinic on Friday",
                "Done: Friday at 11:00 at Elm Street.",
            ),
            "another time the assistant stated",
        ),
    ],
)
def test_a_differing_detail_the_request_depends_on_refuses(matcher, changed, what):
    verdict = matcher.explain(BOOKED, changed)
    assert verdict.rejected and verdict.rule == "context-detail", what


def test_a_change_of_mind_refuses(matcher):
    changed = talk(
        "can you move it to the afternoon?",
        "I need to book a dentist cleaning at the Elm Street clinic on Friday",
        "Done: Friday at 9:00 at Elm Street.",
        "actually cancel the cleaning and book a filling instead",
        "Done: Friday at 9:00 at Elm Street.",
    )
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
    changed = talk(
        "can you move it to the afternoon?",
        "I need to book a dentist cleaning at the Oak Avenue clinic on Friday",
        "Done: Friday at 9:00 at Oak Avenue.",
    )
    monkeypatch.setattr(context, "differing", lambda a, b: [])
    verdict = matcher.explain(BOOKED, changed)
    assert verdict.rule != "context-detail"


def test_taking_out_the_latest_exchange_rule_serves_a_follow_up_without_its_referent(matcher, monkeypatch):
    monkeypatch.setattr(context, "points_back", lambda request: False)
    monkeypatch.setattr(reading, "points_back", lambda request: False)
    assert not matcher.explain(BOOKED, talk("can you move it to the afternoon?")).rejected


def test_a_request_that_names_what_the_turns_talked_about_depends_on_them(matcher, monkeypatch):
    """ "where is the rattle coming from?" has no pronoun, but the rattle is the one described
    before: a request sharing a word with the turns is compared against them, not served as
    standing alone."""
    braking = talk("where is the rattle coming from?", "my car makes a rattle when I brake", "At any speed?")
    speeding = talk(
        "where is the rattle coming from?", "my car makes a rattle when I speed up", "At any speed?"
    )
    assert matcher.explain(braking, speeding).rejected
    monkeypatch.setattr(context, "needed_turns", lambda request, turns: [])
    assert not matcher.explain(braking, speeding).rejected


def test_a_sentence_the_other_side_tells_in_other_words_does_not_block_a_hit(matcher, monkeypatch):
    """One side splits what the other says in one sentence, or puts it another way: what it
    states is told there, so it is no difference; a sentence stating another thing still is."""
    request = "so what should I check first?"
    split = talk(request, "My kettle keeps tripping the breaker. I bought it two years ago.", "Let's see.")
    merged = talk(request, "kettle (2 yrs old) keeps tripping the breaker", "Let's see.")
    put_otherwise = talk(request, "since last week the breaker trips whenever the kettle runs", "Let's see.")
    weekly = talk(request, "The kettle trips the breaker. It started last week.", "Let's see.")
    toaster = talk(request, "since last week the breaker trips whenever the toaster runs", "Let's see.")
    assert not matcher.explain(split, merged).rejected
    assert not matcher.explain(weekly, put_otherwise).rejected
    assert matcher.explain(weekly, toaster).rejected
    monkeypatch.setattr(context, "RESTATABLE", frozenset())
    assert matcher.explain(split, merged).rejected
    assert matcher.explain(weekly, put_otherwise).rejected


def test_what_a_side_tells_a_sentence_must_hold_its_words_its_kinds_negations_and_changes():
    """``_Told.restates``: half a sentence's words said on the other side, every word naming a
    kind of thing, no negation or change of mind the other side does not say anywhere."""
    told = context._Told.of(
        [
            s
            for i, t in enumerate(["The kettle trips the breaker.", "It started last week."])
            for s in reading.sentences(i, Turn("user", t))
        ],
        "so what should I check first?",
    )

    def restated(text: str) -> bool:
        return told.restates(reading.sentences(0, Turn("user", text))[0], "context-unmatched")

    assert restated("the breaker goes off with the kettle")
    assert not restated("the fuse box hums near the fridge")  # none of its words
    assert not restated("the kettle never trips the breaker")  # a negation said here only
    assert not restated("the kettle doesn't trip the breaker")  # contracted
    assert not restated("wait, the kettle trips the breaker")  # a change of mind said here only
    assert not restated("the kettle trips the breaker in the uk")  # a place said here only


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


def test_turns_of_more_sentences_than_the_bound_are_matched_exactly_only_and_never_read(matcher, monkeypatch):
    """A client may send 128 turns of 2,000 characters: the sentences are counted before any is
    read, and past MAX_CONTEXT_SENTENCES the turns are compared word for word."""
    wordy = " ".join(f"The router restarts at {h} o'clock." for h in range(1, 24))
    turns = (Turn("user", wordy), Turn("assistant", "Noted."))
    long = turns * (context.MAX_CONTEXT_SENTENCES // 23 + 1)
    monkeypatch.setattr(context, "sentences", lambda *a: pytest.fail("read"))
    verdict = matcher.explain(Conversation(BOOKED.request, long), Conversation(BOOKED.request, long[2:]))
    assert verdict.rejected and verdict.rule == "context-too-long"


def test_a_comparison_asks_the_guard_a_bounded_number_of_times(matcher, monkeypatch):
    """Each sentence is judged against its closest few, and a comparison past MAX_JUDGED
    judgments is matched exactly only: the cost is bounded by counts, the same everywhere."""
    said = talk(
        "so what should I check first?", "The kettle trips the breaker. It started last week.", "Let's see."
    )
    other = talk(
        "so what should I check first?",
        "since last week the breaker trips whenever the kettle runs",
        "Let's see.",
    )
    assert not matcher.explain(said, other).rejected
    monkeypatch.setattr(context, "MAX_JUDGED", 0)
    verdict = matcher.explain(said, other)
    assert verdict.rejected and verdict.rule == "context-too-long"


# Each check below, and what taking it out would serve. The monkeypatched runs are the proof
# that the check, not something else, refuses the pair.

DIAGNOSED = talk(
    "what usually helps with that?",
    "I get a dull ache on both sides of my head by the afternoon.",
    "Based on what you describe, this sounds most like a tension-type headache.",
)
OTHER_DIAGNOSIS = talk(
    "what usually helps with that?",
    "I get a dull ache on both sides of my head by the afternoon.",
    "Based on what you describe, this sounds most like a migraine.",
)


def test_a_statement_edited_in_one_word_is_a_difference(matcher, monkeypatch):
    verdict = matcher.explain(DIAGNOSED, OTHER_DIAGNOSIS)
    assert verdict.rejected and verdict.rule == "context-edited", verdict
    monkeypatch.setattr(context, "EDIT_SHARED_MIN", 10_000)
    assert not matcher.explain(DIAGNOSED, OTHER_DIAGNOSIS).rejected


def test_each_sentence_needs_a_counterpart_not_only_each_turn(matcher, monkeypatch):
    """A turn that keeps one sentence and replaces the other: read whole, the guard would take
    the two turns for one request reworded."""
    rented = talk(
        "if it's broken will you replace it for free?",
        "My internet light is blinking red and nothing connects. The modem is rented from you "
        "guys, it's on my bill.",
        "Let's try a restart first.",
    )
    bought = talk(
        "if it's broken will you replace it for free?",
        "My internet light is blinking red and nothing connects. I bought my own modem at a "
        "store a couple years ago.",
        "Let's try a restart first.",
    )
    assert matcher.explain(rented, bought).rejected
    monkeypatch.setattr(reading, "segments", lambda text: (text,))
    assert not matcher.explain(rented, bought).rejected


def test_the_same_words_in_another_order_refuse_a_request_that_points_back(matcher, monkeypatch):
    first = talk("is the second one contagious?", "my son has a cold and my wife has the flu")
    swapped = talk("is the second one contagious?", "my wife has the flu and my son has a cold")
    verdict = matcher.explain(first, swapped)
    assert verdict.rejected and "order" in verdict.rule
    monkeypatch.setattr(context, "_order", lambda turn, words: ())
    assert not matcher.explain(first, swapped).rejected


def test_an_aside_the_user_marks_does_not_block_a_hit(matcher, monkeypatch):
    aside = talk(
        "can you move it to the afternoon?",
        "random q, is there parking at the clinic?",
        "Yes, free parking behind the building.",
        "I need to book a dentist cleaning at the Elm Street clinic on Friday",
        "Done: Friday at 9:00 at Elm Street.",
    )
    assert not matcher.explain(BOOKED, aside).rejected
    monkeypatch.setattr(reading, "ASIDE", re.compile("(?!)"))
    assert matcher.explain(BOOKED, aside).rejected


def test_an_aside_just_before_the_request_counts_only_where_the_request_is_about_it(matcher):
    """An aside asked last ("random q, is there parking?") is still an aside where the request's
    own words are about an earlier exchange and none about the aside; a request about it (or
    one with no words of its own to tell) depends on it."""
    booked = talk(
        "can I still cancel the cleaning without a fee?",
        "I need to book a dentist cleaning at the Elm Street clinic on Friday",
        "Done: Friday at 9:00 at Elm Street.",
    )
    aside = talk(
        "can I still cancel the cleaning without a fee?",
        "I need to book a dentist cleaning at the Elm Street clinic on Friday",
        "Done: Friday at 9:00 at Elm Street.",
        "random q, is there parking at the clinic?",
        "Yes, 2 hours of parking behind the building.",
    )
    assert not matcher.explain(booked, aside).rejected
    for request in ("how long can I leave my car in the parking?", "and is that free?"):
        about = talk(request, *(t.text for t in booked.context))
        about_aside = talk(request, *(t.text for t in aside.context))
        assert matcher.explain(about, about_aside).rejected


def test_a_reaction_said_in_passing_does_not_block_a_hit_but_a_change_of_mind_does(matcher, monkeypatch):
    reacted = talk(
        "can you move it to the afternoon?",
        "I need to book a dentist cleaning at the Elm Street clinic on Friday",
        "Done: Friday at 9:00 at Elm Street.",
        "haha great, my teeth thank you",
    )
    changed = talk(
        "can you move it to the afternoon?",
        "I need to book a dentist cleaning at the Elm Street clinic on Friday",
        "Done: Friday at 9:00 at Elm Street.",
        "haha actually make it a whitening",
    )
    assert not matcher.explain(BOOKED, reacted).rejected
    assert matcher.explain(BOOKED, changed).rejected
    monkeypatch.setattr(context, "aside", lambda turn: False)
    assert matcher.explain(BOOKED, reacted).rejected


def test_a_request_that_stands_alone_still_needs_the_same_standing_instructions(matcher, monkeypatch):
    question = "what is the boiling point of ethanol"
    plain = talk(question, "hi", "Hello!")
    french = talk(question, "from now on answer in French please", "D'accord !")
    verdict = matcher.explain(plain, french)
    assert verdict.rejected and verdict.rule == "context-instruction"
    monkeypatch.setattr(context, "INSTRUCTION", re.compile("(?!)"))
    assert not matcher.explain(plain, french).rejected


@pytest.mark.parametrize(
    "request_text, points",
    [
        ("how much is it?", True),
        ("is the answer 7/8?", True),
        ("do I need an x-ray?", True),
        ("and for two people?", True),
        ("tell me more about the second one", True),
        ("how do I reverse a string in python?", False),
        ("how should I split my revision time?", True),  # the user's own time, told before
        ("how do I begin with the plan I picked?", True),
        ("why do onions make people cry when cut?", False),
    ],
)
def test_what_points_back(request_text, points):
    assert reading.points_back(request_text) is points
