"""How the context matcher reads a conversation's earlier turns: the details each sentence states
(numbers, in one unit too, and names), and which of them the other side does not state. Each
case fails when the reading it names is taken out."""

from __future__ import annotations

from gpucache.conversation import reading
from gpucache.conversation.reading import differing, read_text, sentences
from gpucache.conversation.value import Turn


def said(*texts: str, role: str = "user") -> list[reading.Sentence]:
    return [s for i, text in enumerate(texts) for s in sentences(i, Turn(role, text))]


def test_an_ordinal_places_what_was_said_and_states_no_number():
    """ "Fix the leak first" orders two steps; it does not say "1" (the order check compares
    places), while a count is a detail."""
    assert read_text("Fix the leak first, then repaint.")[1] == frozenset()
    assert "#4" in read_text("There are 4 of us.")[1]


def test_a_number_restated_in_another_unit_is_still_stated():
    thirty = said("I practise for 30 minutes a day.")
    assert differing(thirty, said("I put in half an hour every day.")) == []
    assert differing(thirty, said("I put in an hour every day.")) == ["#30"]


def test_a_month_or_a_day_shortened_is_the_same_name():
    january = said("The plan renews on January 1.")
    assert "name:january" in read_text("It renews on Jan 1.")[1]
    assert differing(january, said("It renews on Jan 1.")) == []
    assert differing(january, said("It renews on June 1.")) == ["name:january"]
