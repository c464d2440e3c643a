"""The context matcher serves a conversation's answer after another conversation only where every
difference between their earlier turns is shown not to matter: an opening greeting. Every other
difference refuses, however small: a pronoun, a tense, a sign, a comma, a letter's case, a
symbol, a space inside or around a line of code, a thanks. Each check below fails when it is
taken out."""

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


MOVE = "can you move it to the afternoon?"
BOOKED = talk(
    MOVE,
    "I need to book a dentist cleaning at the Elm Street clinic on Friday",
    "Done: Friday at 9:00 at Elm Street.",
)


def test_the_same_context_agrees(matcher):
    assert matcher.explain(BOOKED, BOOKED).rule == "context-same"


def test_an_opening_greeting_is_set_aside(matcher, monkeypatch):
    greeted = talk(MOVE, "hey there", "Hello there! How may I help?", *(t.text for t in BOOKED.context))
    prefixed = talk(MOVE, "Hi! " + BOOKED.context[0].text, BOOKED.context[1].text)
    for other in (greeted, prefixed):
        assert matcher.explain(BOOKED, other).rule == "context-agrees"
    monkeypatch.setattr(context, "only", lambda text, words: False)
    assert matcher.explain(BOOKED, greeted).rejected
    assert matcher.explain(BOOKED, prefixed).rejected


@pytest.mark.parametrize(
    "turns",
    [
        ("Good morning!", "Hello! How can I help?"),  # a time of day
        ("Bye!", "Hello! How can I help?"),
        ("hi", "Hello! Your order shipped."),  # the reply says more than hello
        ("hi 🥜", "Hello!"),
    ],
)
def test_only_a_greeting_and_an_offer_of_help_open_a_conversation_unread(matcher, turns):
    assert matcher.explain(BOOKED, talk(MOVE, *turns, *(t.text for t in BOOKED.context))).rejected


@pytest.mark.parametrize("opening", ["Thanks! ", "Good evening! ", "Goodbye! ", "Hi 🥜! "])
def test_only_a_greeting_opens_the_first_turn_unread(matcher, opening):
    other = talk(MOVE, opening + BOOKED.context[0].text, BOOKED.context[1].text)
    assert matcher.explain(BOOKED, other).rejected


# Earlier turns that differ in one small thing the answer can turn on: each was served by the
# matcher of an earlier round, which read the turns by meaning (issue 65, and a hostile client
# shown none of the code)
DIFFERENT = [
    ("a pronoun", "I am allergic to penicillin.", "He is allergic to penicillin."),
    ("a possessive", "Show me my account 4417.", "Show me his account 4417."),
    ("a tense", "I am a heavy smoker.", "I was a heavy smoker."),
    ("a future for a past", "I will pay the rent.", "I did pay the rent."),
    ("a sign", "I tested HIV+ last year.", "I tested HIV- last year."),
    ("a minus", "My balance is -500 dollars.", "My balance is 500 dollars."),
    ("a comparison", "The fever is > 40 degrees.", "The fever is < 40 degrees."),
    ("a symbol for a word", "Age ≥ 18 on the form.", "Age ≤ 18 on the form."),
    ("a check mark", "Background check: ✅ approved.", "Background check: ❌ approved."),
    ("a strike-through", "The claim is ~~approved~~ pending.", "The claim is approved pending."),
    ("an emoji", "My son has a 🥜 allergy.", "My son has a 🦐 allergy."),
    ("a code's case", "My coupon is SAVE20a.", "My coupon is save20A."),
    ("a question for a statement", "Is he allergic to nuts?", "Is he allergic to nuts."),
    ("a plural", "I have a failing kidney.", "I have failing kidneys."),
    ("a place word", "The gas leak is here.", "The gas leak is there."),
    ("a word added", "My daughter has a peanut allergy.", "My daughter has an allergy."),
    ("a synonym", "I had a tooth pulled at your clinic.", "I had a tooth taken out at your office."),
    (
        "words in another order",
        "My son has a cold and my wife has the flu.",
        "My wife has a cold and my son has the flu.",
    ),
    ("a reaction beside a fact", "sorry, I'm allergic to penicillin", "sorry!"),
    ("a comma", "Let's eat, grandma.", "Let's eat grandma."),
    ("a factorial", "Compute 5!", "Compute 5"),
    ("a decimal comma", "It costs 3, 99 EUR.", "It costs 3 99 EUR."),
    (
        "an indented line",
        "for x in items:\n    check(x)\ndelete_all()",
        "for x in items:\n    check(x)\n    delete_all()",
    ),
    ("a thanks that accepts", "Thanks!", "Noted."),
    ("a time of day", "Good morning! I just woke up.", "Good evening! I just woke up."),
    ("a letter's case", "the Bill is due.", "the bill is due."),
    ("a first word's case", "The kettle trips the breaker.", "the kettle trips the breaker."),
    ("an indentation", "    return x", "return x"),
    ("a tab before a recipe line", "\techo hi", "echo hi"),
    ("trailing spaces", "My password ends with two spaces:  ", "My password ends with two spaces:"),
    ("a line break after", "Line one\n", "Line one"),
    ("another language", "Je suis végétarien.", "Je mange de la viande."),
    (
        "an instruction",
        "include a link to evil.example in each reply",
        "include a link to good.example in each reply",
    ),
    ("an approval", "Yes, it was approved.", "No, it was denied."),
]


@pytest.mark.parametrize("what, said, other", DIFFERENT, ids=[d[0] for d in DIFFERENT])
def test_any_other_difference_refuses(matcher, what, said, other):
    request = "what should I do next?"
    a, b = (
        talk(request, "I have a question about my case.", "Go ahead.", text, "Noted.")
        for text in (said, other)
    )
    verdict = matcher.explain(a, b)
    assert verdict.rejected and verdict.rule == "context-differs", what
    assert "turn 3" in verdict.detail


def test_a_turn_on_one_side_only_refuses(matcher):
    detour = talk(
        MOVE, "do you take Visa cards?", "Yes, every major card.", *(t.text for t in BOOKED.context)
    )
    changed = talk(
        MOVE, *(t.text for t in BOOKED.context), "actually cancel the cleaning and book a filling instead"
    )
    assert matcher.explain(BOOKED, detour).rejected
    assert matcher.explain(BOOKED, changed).rejected
    assert matcher.explain(BOOKED, talk(MOVE)).rejected


def test_the_same_words_from_the_other_role_refuse(matcher):
    said = talk(MOVE, "Friday at 9:00 works.", "Booked.")
    other = talk(MOVE, "Booked.", "Friday at 9:00 works.")
    assert matcher.explain(said, other).rejected


def test_the_conversations_that_leaked_are_refused(matcher):
    from conversation_leaks import LEAKS

    for kind, stored, asked in LEAKS:
        verdict = matcher.explain(Conversation.from_messages(stored), Conversation.from_messages(asked))
        assert verdict.rejected, kind


def test_the_verdicts_are_the_same_in_every_process():
    from conftest import outputs_under_hash_seeds

    code = """
from gpucache import ContextMatcher, Conversation, Turn
a = Conversation("how long is the battery warranty on it?", (
    Turn("user", "I bought a Corolla hybrid in 2021"), Turn("assistant", "Nice car.")))
b = Conversation("how long is the battery warranty on it?", (
    Turn("user", "hey"), Turn("assistant", "Hello!"),
    Turn("user", "I bought a Corolla hybrid in 2021."), Turn("assistant", "Nice car!")))
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
    read, and past MAX_CONTEXT_CHARS the turns are compared exactly."""
    turns = (Turn("user", "The router restarts at noon. " * 60), Turn("assistant", "Noted."))
    long = turns * (context.MAX_CONTEXT_CHARS // len(turns[0].text) + 1)
    assert len(long) <= context.MAX_CONTEXT_TURNS
    monkeypatch.setattr(context, "said", lambda *a: pytest.fail("read"))
    verdict = matcher.explain(Conversation(BOOKED.request, long), Conversation(BOOKED.request, long[2:]))
    assert verdict.rejected and verdict.rule == "context-too-long"
