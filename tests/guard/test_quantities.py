"""The same amount in other units (gpucache/guard/quantities.py): one unit per quantity, exact,
and the guard reading a pair that way only where that makes its numbers agree."""

from __future__ import annotations

import pytest

from gpucache.guard import quantities
from gpucache.guard.lexical import LexicalNearMissVerifier


@pytest.mark.parametrize(
    "written, read",
    [
        ("rest it 3 minutes", "rest it 180 seconds"),
        ("rest it for 1.5 hours", "rest it for 5400 seconds"),
        ("half an hour", "1800 seconds"),
        ("a quarter of an hour", "900 seconds"),
        ("an hour", "3600 seconds"),
        ("every two days", "every 172800 seconds"),
        ("a 5-day hike", "a 432000 seconds hike"),
        ("500mg tablets", "0.5 grams tablets"),
        ("2 kg of flour", "2000 grams of flour"),
        ("1,500 grams", "1500 grams"),
        ("3.5 km", "3500 metres"),
        ("12 cm", "0.12 metres"),
        ("a quarter of a litre", "250 millilitres"),
        ("1/3 litre", "1/3 litre"),  # a fraction: as written
        ("one third of a litre", "1000/3 millilitres"),
        ("at 4pm", "at 16:00"),
        ("at 9:15 a.m.", "at 09:15"),
        ("at 12am", "at 00:00"),
        ("by noon", "by 12:00"),
        ("10 miles", "10 miles"),
        ("2 cups", "2 cups"),
        ("the 1960s", "the 1960s"),  # no exact ratio; decades
        ("at 13pm", "at 13pm"),
        ("3 m/s", "3 m/s"),
        ("v1.5 km", "v1.5 km"),
        ("at 1pm", "at 13:00"),
        ("at Midnight", "at 00:00"),  # the clock's first hour; midnight is no noon
        ("1250 mg", "1.25 grams"),  # two places
        (
            "0.000000000000000000000000000001 kg",
            "0.000000000000000000000000001 grams",
        ),  # past a double's digits
    ],
)
def test_an_amount_is_written_in_one_unit_per_quantity(written, read):
    assert quantities.canonical(written) == read


@pytest.mark.parametrize(
    "a, b",
    [
        ("how long should dough proof, 2 hours?", "how long should dough proof, 120 minutes?"),
        ("is 1000 mg of vitamin C a day too much", "is 1 g of vitamin C a day too much"),
        ("set a timer for half an hour", "set a timer for 30 minutes"),
        ("book the call for 3pm", "book the call for 15:00"),
        ("a 400 metre sprint plan", "a 0.4 km sprint plan"),
    ],
)
def test_the_same_amount_in_other_units_is_no_difference_of_numbers(a, b):
    guard = LexicalNearMissVerifier()
    assert not guard.explain(a, b).rejected and not guard.explain(b, a).rejected


@pytest.mark.parametrize(
    "a, b",
    [
        ("how long should dough proof, 2 hours?", "how long should dough proof, 3 hours?"),
        ("is 1000 mg of vitamin C a day too much", "is 1 kg of vitamin C a day too much"),
        ("set a timer for half an hour", "set a timer for 20 minutes"),
        ("book the call for 3pm", "book the call for 03:00"),
        ("jog 5 km before breakfast", "jog 5 miles before breakfast"),
    ],
)
def test_another_amount_is_still_refused(a, b):
    guard = LexicalNearMissVerifier()
    assert guard.explain(a, b).rejected and guard.explain(b, a).rejected


def test_the_units_reading_is_kept_only_where_it_makes_the_numbers_agree():
    guard = LexicalNearMissVerifier()
    verdict = guard.explain("proof it for 2 hours", "proof it for 3 hours")
    assert verdict.rule == "numbers" and verdict.words == ("2", "3")  # told as written, not in seconds


def test_the_units_reading_keeps_the_verifiers_own_reading_of_words():
    """A verifier without the table of interchangeable words reads both sides without it, the
    units reading too: "purchase" is "purchase" on both, not "buy" on one."""
    guard = LexicalNearMissVerifier(table=False)
    assert not guard.explain("purchase 2 kg of rice", "purchase 2000 g of rice").rejected
    assert not guard.explain("purchase 2000 g of rice", "purchase 2 kg of rice").rejected
