"""How the guard reads numbers (gpucache/guard/parsing.py): exactly, the same in every thread,
on every interpreter and at every length, since a verdict is a pure function of the two
prompts and the parse is memoised for the whole process."""

from __future__ import annotations

import decimal
import sys
import threading

import pytest

from gpucache import LexicalNearMissVerifier
from gpucache.guard.parsing import _number, parse

V = LexicalNearMissVerifier()


@pytest.mark.parametrize("written, canonical", [
    ("7", "7"), ("007", "7"), ("7.0", "7"), ("10.50", "10.5"), ("0", "0"), ("000.000", "0"),
    ("0.25", "0.25"), ("١٢.٥٠", "12.5"),  # Arabic-Indic digits read as their values
    ("1" * 40, "1" * 40), ("1" * 39 + ".10", "1" * 39 + ".1"),
])
def test_a_number_is_read_in_one_canonical_form(written, canonical):
    assert _number(written) == canonical


@pytest.mark.parametrize("written, scale, product", [
    ("10", 1000, "10000"), ("2.5", 1000, "2500"), ("1.23456", 100, "123.456"), ("0.001", 1000, "1"),
    ("0", 10**12, "0"), ("3.14159265358979323846264338327950288", 10**9, "3141592653.58979323846264338327950288"),
])
def test_a_scaled_number_is_multiplied_exactly(written, scale, product):
    from gpucache.guard.parsing import _scaled

    assert _scaled(written, scale) == product


def test_a_verdict_does_not_depend_on_the_decimal_context_of_any_thread():
    """``decimal``'s context is per thread and settable by any code in the process: a number
    read through it at precision 4 rounds 123456 and 123459 alike, and the memo then serves the
    first reading to every thread."""
    verdicts = {}

    def hostile() -> None:
        decimal.getcontext().prec = 4
        verdicts["hostile"] = V.explain("Is 123456 a prime number?", "Is 123459 a prime number?")
        verdicts["scaled"] = V.explain("Is 2.5001k a lot of money?", "Is 2.5002k a lot of money?")

    thread = threading.Thread(target=hostile)
    thread.start()
    thread.join()
    assert verdicts["hostile"].rejected and verdicts["hostile"].rule == "numbers"
    assert verdicts["scaled"].rejected and verdicts["scaled"].rule == "numbers"
    # and the reading the memo keeps is the exact one, for this thread too
    assert V.explain("Is 123456 a prime number?", "Is 123459 a prime number?").rule == "numbers"
    assert parse("Is 2.5001k a lot of money?").numbers == ("2500.1",)


def test_numbers_longer_than_a_decimal_context_holds_are_told_apart():
    """At the default precision (28 digits) thirty 1s and twenty-nine 1s then a 2 rounded alike."""
    a, b = "1" * 30, "1" * 29 + "2"
    verdict = V.explain(f"Is {a} divisible by 7?", f"Is {b} divisible by 7?")
    assert verdict.rejected and verdict.rule == "numbers"


def test_an_ordinal_longer_than_the_interpreters_digit_limit_is_read():
    """``int()`` refuses a string of more digits than ``sys.get_int_max_str_digits()`` (4,300
    unless the environment says otherwise); an ordinal that long is read all the same."""
    digits = (sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300) + 10
    a, b = "1" * digits + "th", "1" * (digits - 1) + "2th"
    verdict = V.explain(f"Who finished {a} in the race?", f"Who finished {b} in the race?")
    assert verdict.rejected and verdict.rule == "numbers"


def test_what_a_memo_hands_out_cannot_be_changed_by_its_caller():
    """The memoised word counts are shared by every verdict in the process: a caller that
    changed them would change every later verdict on that prompt."""
    from gpucache.guard.differences import _counts

    every, counted = _counts(("reset", "password", "reset"))
    for change in (lambda: every.__setitem__("reset", 0), lambda: every.update(["x"]),
                   lambda: counted.pop("reset"), lambda: counted.clear()):
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert _counts(("reset", "password", "reset"))[0] == {"reset": 2, "password": 1}
    assert type(every - counted).__name__ == "Counter"  # arithmetic gives a new, ordinary one


@pytest.mark.parametrize("contracted, written_out", [
    ("I can't log in to the portal", "I can not log in to the portal"),
    ("the printer won't start", "the printer will not start"),
    ("we shan't renew the lease", "we shall not renew the lease"),
    ("the build doesn't finish", "the build does not finish"),
    ("this isn't my invoice", "this is not my invoice"),
])
def test_a_negative_contraction_reads_as_its_written_out_form(contracted, written_out):
    from gpucache.guard.parsing import parse

    assert parse(contracted).tokens == parse(written_out).tokens
    assert parse(contracted).negations == parse(written_out).negations == 1


@pytest.mark.parametrize("tail", ["s", "re", "ve", "ll", "d", "m"])
def test_a_tail_that_only_marks_a_verb_or_an_owner_is_read_away(tail):
    from gpucache.guard.parsing import parse

    assert parse(f"they{chr(39)}{tail} ready for the audit").tokens == parse("they ready for the audit").tokens


def test_any_other_tail_is_kept_as_a_word_of_its_own():
    from gpucache.guard.parsing import parse

    assert "clock" in parse("set an o'clock alarm").tokens
    assert parse("set an o'clock alarm").tokens != parse("set an o alarm").tokens
