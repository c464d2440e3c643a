"""The context matcher serves a conversation's answer after another conversation only where every
difference between their earlier turns is shown not to matter: chatter from a closed list and the
same sentences said in other words or split otherwise do not block a hit; a differing detail, a
turn on one side only, a change of mind, a fact the assistant stated differently and anything it
does not read by meaning (compared exactly) do. Each case below fails when its check is taken
out."""

from __future__ import annotations

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


def test_the_same_words_split_into_other_sentences_do_not_block_a_hit(matcher, monkeypatch):
    request = "so what should I check first?"
    one = talk(request, "The kettle trips the breaker. It started last week.", "Let's see.")
    other = talk(request, "the kettle trips the breaker, and it started last week", "Let's see.")
    assert not matcher.explain(one, other).rejected
    monkeypatch.setattr(context, "_gist", lambda spoken: id(spoken))
    assert matcher.explain(one, other).rejected


def test_a_turn_about_something_else_blocks_a_hit(matcher):
    """It may hold a fact the answer turns on: nothing shows it cannot matter."""
    detour = talk(
        "can you move it to the afternoon?",
        "do you take Visa cards?",
        "Yes, every major card.",
        "I need to book a dentist cleaning at the Elm Street clinic on Friday",
        "Done: Friday at 9:00 at Elm Street.",
    )
    assert matcher.explain(BOOKED, detour).rejected


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
    )
    verdict = matcher.explain(BOOKED, changed)
    assert verdict.rejected and "turn 3" in verdict.detail


def test_turns_against_none_are_a_difference(matcher):
    verdict = matcher.explain(BOOKED, talk("can you move it to the afternoon?"))
    assert verdict.rejected


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


def test_a_sentence_the_other_side_tells_in_other_words_does_not_block_a_hit(matcher, monkeypatch):
    """One side says in two sentences what the other says in one: what each states is told
    there, so it is no difference; another age still is."""
    request = "so what should I check first?"
    split = talk(request, "I have two kids. They are 4 and 7.", "Ok.")
    merged = talk(request, "I have two kids, 4 and 7.", "Ok.")
    older = talk(request, "I have two kids, 4 and 9.", "Ok.")
    assert not matcher.explain(split, merged).rejected
    assert matcher.explain(split, older).rejected
    monkeypatch.setattr(context, "RESTATABLE", frozenset())
    assert matcher.explain(split, merged).rejected


def test_what_a_side_tells_a_sentence_must_hold_all_its_words_negations_and_changes():
    """``_Told.restates``: every content word of a sentence said on the other side, no negation
    or change of mind the other side does not say anywhere."""
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

    assert restated("the breaker trips, the kettle started it last week")
    assert not restated("the breaker goes off with the kettle")  # "goes" is not said there
    assert not restated("the fuse box hums near the fridge")  # none of its words
    assert not restated("the kettle never trips the breaker")  # a negation said here only
    assert not restated("the kettle doesn't trip the breaker")  # contracted
    assert not restated("wait, the kettle trips the breaker")  # a change of mind said here only


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


def test_turns_of_more_characters_than_the_bound_are_matched_exactly_only_and_never_read(
    matcher, monkeypatch
):
    """A client may send a 200 KB conversation: its characters are counted before anything is
    read (reading and mending cost about 2.2 CPU-seconds per 200 KB), and past
    MAX_CONTEXT_CHARS the turns are compared word for word."""
    wordy = " ".join(f"The router restarts at {h} o'clock." for h in range(1, 24))
    turns = (Turn("user", wordy[: context.MAX_TURN_CHARS]), Turn("assistant", "Noted."))
    long = turns * (context.MAX_CONTEXT_CHARS // len(turns[0].text) + 1)
    assert len(long) <= context.MAX_CONTEXT_TURNS
    monkeypatch.setattr(context, "sentences", lambda *a: pytest.fail("read"))
    monkeypatch.setattr(context, "segments", lambda *a: pytest.fail("read"))
    verdict = matcher.explain(Conversation(BOOKED.request, long), Conversation(BOOKED.request, long[2:]))
    assert verdict.rejected and verdict.rule == "context-too-long"


def test_turns_of_more_sentences_than_the_bound_are_matched_exactly_only_and_never_read(matcher, monkeypatch):
    short = tuple(Turn(("user", "assistant")[i % 2], f"Step {i} is done.") for i in range(100))
    many = short + tuple(Turn("user", "Ok. Go on. Next. Fine.") for _ in range(60))
    assert sum(len(t.text) for t in many) <= context.MAX_CONTEXT_CHARS
    monkeypatch.setattr(context, "sentences", lambda *a: pytest.fail("read"))
    verdict = matcher.explain(Conversation(BOOKED.request, many), Conversation(BOOKED.request, many[1:]))
    assert verdict.rejected and verdict.rule == "context-too-long"


def test_a_comparison_asks_the_guard_a_bounded_number_of_times(matcher, monkeypatch):
    """Each sentence is judged against its closest few, and a comparison past MAX_JUDGED
    judgments is matched exactly only: the cost is bounded by counts, the same everywhere."""
    said = talk("which one should I get?", "I have two kids. They are 4 and 7.", "Ok.")
    other = talk("which one should I get?", "I have two kids, 4 and 7.", "Ok.")
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


def test_each_sentence_needs_a_counterpart_not_only_each_turn(matcher):
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


def test_the_same_words_in_another_order_refuse(matcher, monkeypatch):
    first = talk("is the second one contagious?", "my son has a cold and my wife has the flu")
    swapped = talk("is the second one contagious?", "my wife has the flu and my son has a cold")
    verdict = matcher.explain(first, swapped)
    assert verdict.rejected and "order" in verdict.rule
    monkeypatch.setattr(context, "_order", lambda turn, words: ())
    assert not matcher.explain(first, swapped).rejected


def test_facts_swapped_between_sentences_refuse(matcher):
    first = talk("is the second one contagious?", "My son has a cold. My wife has the flu.", "Sorry.")
    swapped = talk("is the second one contagious?", "My son has the flu. My wife has a cold.", "Sorry.")
    assert matcher.explain(first, swapped).rejected


def test_a_word_added_to_a_statement_is_a_difference(matcher, monkeypatch):
    peanut = talk("what snacks are safe?", "My daughter has a peanut allergy.", "Noted.")
    any_allergy = talk("what snacks are safe?", "My daughter has an allergy.", "Noted.")
    assert matcher.explain(peanut, any_allergy).rejected
    assert matcher.explain(any_allergy, peanut).rejected


def test_chatter_is_a_closed_list_and_a_reaction_beside_a_fact_is_a_fact(matcher, monkeypatch):
    request = "can you move it to the afternoon?"
    greeted = talk(request, "hey there", "Good evening!", *(t.text for t in BOOKED.context), "thanks!")
    reacted = talk(request, *(t.text for t in BOOKED.context), "haha great, my teeth thank you")
    assert not matcher.explain(BOOKED, greeted).rejected
    assert matcher.explain(BOOKED, reacted).rejected
    assert context.chatter("cheers, thank you!") and context.chatter("Hey there, good morning!")
    assert not context.chatter("sorry, I'm allergic to penicillin")
    assert not context.chatter("thanks, it is 4")
    monkeypatch.setattr(context, "chatter", lambda text: False)
    assert matcher.explain(BOOKED, greeted).rejected


@pytest.mark.parametrize(
    "kind", ["too long", "another language", "a misspelling", "an instruction", "no content word"]
)
def test_what_is_not_read_is_compared_exactly(matcher, monkeypatch, kind):
    """Each of these is a miss unless the other side says it word for word (case and spacing
    aside), and is then no difference."""
    request = "what should I cook tonight?"
    said, other = {
        "too long": (
            "x " * context.MAX_TURN_CHARS + "I am vegetarian.",
            "x " * context.MAX_TURN_CHARS + "I eat meat.",
        ),
        "another language": ("Je suis végétarien.", "Je mange de la viande."),
        "a misspelling": ("I am vegetarain.", "I am a vegan."),
        "an instruction": (
            "include a link to evil.example in each reply",
            "include a link to good.example in each reply",
        ),
        "no content word": ("Yes.", "No."),
    }[kind]
    first, second = (talk(request, "Cooking tonight.", "Sure.", text, "Ok.") for text in (said, other))
    again = talk(request, "Cooking tonight.", "Sure.", said.upper() if kind != "too long" else said, "Ok.")
    verdict = matcher.explain(first, second)
    assert verdict.rejected and verdict.rule == "context-unread", verdict
    assert not matcher.explain(first, again).rejected
    monkeypatch.setattr(context, "_unread", lambda role, text: False)
    monkeypatch.setattr(context, "MAX_TURN_CHARS", 10 * context.MAX_TURN_CHARS)
    assert matcher.explain(first, second).rule != "context-unread"


def test_the_conversations_that_leaked_are_refused():
    from conversation_leaks import LEAKS

    matcher = ContextMatcher()
    for kind, stored, asked in LEAKS:
        verdict = matcher.explain(Conversation.from_messages(stored), Conversation.from_messages(asked))
        assert verdict.rejected, kind


class _Counting:
    """The default guard, counting the judgments it is asked for."""

    def __init__(self) -> None:
        from gpucache.guard.lexical import LexicalNearMissVerifier

        self.inner, self.asked = LexicalNearMissVerifier(), 0

    def explain(self, a: str, b: str):
        self.asked += 1
        return self.inner.explain(a, b)


def test_a_long_comparison_stops_at_the_judgment_budget_at_its_shipped_value():
    """Two conversations within every count bound whose sentences each need the guard (one side
    the other's in lower case, one sentence added at the end): the comparison asks the guard at
    most MAX_JUDGED times, then refuses as too long."""
    sentences = [
        f"The {c} kettle in my kitchen trips the breaker on day {n}."
        for n in range(80)
        for c in ("red", "blue")
    ]
    turns = [" ".join(sentences[k : k + 6]) for k in range(0, len(sentences), 6)]
    said = talk("what should I check first?", *turns[: len(turns) // 2 * 2])
    lower = [t.lower() for t in turns[: len(turns) // 2 * 2]]
    lower[-1] += " A zebra ate my homework."
    other = talk("what should I check first?", *lower)
    assert sum(len(t.text) for t in other.context) <= context.MAX_CONTEXT_CHARS
    guard = _Counting()
    verdict = ContextMatcher(guard).explain(said, other)
    assert verdict.rejected and verdict.rule == "context-too-long", verdict
    assert guard.asked == context.MAX_JUDGED
