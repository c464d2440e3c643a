"""How the guard reads a prompt (gpucache/guard/parsing.py): numbers exactly, the same in every
thread, on every interpreter and at every length, since a verdict is a pure function of the two
prompts and the parse is memoised for the whole process; scales, ordinals, powers and digit
groups as one number; contractions as their written-out words; the table of interchangeable
words; and memos that hold only what is short enough to keep."""

from __future__ import annotations

import decimal
import sys
import threading

import pytest

from gpucache import LexicalNearMissVerifier
from gpucache.guard.parsing import _number, parse

V = LexicalNearMissVerifier()


@pytest.mark.parametrize(
    "written, canonical",
    [
        ("7", "7"),
        ("007", "7"),
        ("7.0", "7"),
        ("10.50", "10.5"),
        ("0", "0"),
        ("000.000", "0"),
        ("0.25", "0.25"),
        ("١٢.٥٠", "12.5"),  # Arabic-Indic digits read as their values
        ("1" * 40, "1" * 40),
        ("1" * 39 + ".10", "1" * 39 + ".1"),
    ],
)
def test_a_number_is_read_in_one_canonical_form(written, canonical):
    assert _number(written) == canonical


@pytest.mark.parametrize(
    "written, scale, product",
    [
        ("10", 1000, "10000"),
        ("2.5", 1000, "2500"),
        ("1.23456", 100, "123.456"),
        ("0.001", 1000, "1"),
        ("0", 10**12, "0"),
        ("3.14159265358979323846264338327950288", 10**9, "3141592653.58979323846264338327950288"),
    ],
)
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
    for change in (
        lambda: every.__setitem__("reset", 0),
        lambda: every.update(["x"]),
        lambda: counted.pop("reset"),
        lambda: counted.clear(),
    ):
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert _counts(("reset", "password", "reset"))[0] == {"reset": 2, "password": 1}
    assert type(every - counted).__name__ == "Counter"  # arithmetic gives a new, ordinary one


@pytest.mark.parametrize(
    "contracted, written_out",
    [
        ("I can't log in to the portal", "I can not log in to the portal"),
        ("the printer won't start", "the printer will not start"),
        ("we shan't renew the lease", "we shall not renew the lease"),
        ("the build doesn't finish", "the build does not finish"),
        ("this isn't my invoice", "this is not my invoice"),
    ],
)
def test_a_negative_contraction_reads_as_its_written_out_form(contracted, written_out):
    from gpucache.guard.parsing import parse

    assert parse(contracted).tokens == parse(written_out).tokens
    assert parse(contracted).negated and parse(written_out).negated


@pytest.mark.parametrize("tail", ["s", "re", "ve", "ll", "d", "m"])
def test_a_tail_that_only_marks_a_verb_or_an_owner_is_read_away(tail):
    from gpucache.guard.parsing import parse

    assert (
        parse(f"they{chr(39)}{tail} ready for the audit").tokens == parse("they ready for the audit").tokens
    )


def test_any_other_tail_is_kept_as_a_word_of_its_own():
    from gpucache.guard.parsing import parse

    assert "clock" in parse("set an o'clock alarm").tokens
    assert parse("set an o'clock alarm").tokens != parse("set an o alarm").tokens


def test_a_word_with_several_apostrophes_reads_as_its_parts():
    assert parse("play some rock'n'roll").tokens == parse("play some rock n roll").tokens
    assert parse("they'd've known").tokens == parse("they known").tokens


# Numbers written in words, digits, suffixes and groups are one number to every rule.


@pytest.mark.parametrize(
    "written", ["two hundred thousand", "200 thousand", "200k", "200,000", "200_000", "200 000", "200000"]
)
def test_a_number_reads_the_same_however_it_is_written(written):
    """A scale after a number multiplies it, and goes on doing so after a scale ("two hundred
    thousand"); digit groups join whatever else the prompt holds."""
    assert parse(written).tokens == ("200000",)
    assert parse(f"book {written} seats").tokens == parse("book 200000 seats").tokens
    assert parse(f"book {written} seats").numbers == ("200000",)


@pytest.mark.parametrize(
    "a, b",
    [
        ("a fund of 2bn", "a fund of 2 billion"),
        ("a fund of 2bn", "a fund of 2,000,000,000"),
        ("a salary of 10k", "a salary of ten thousand"),
    ],
)
def test_a_suffix_scales_the_number_as_a_word_does(a, b):
    assert parse(a).tokens == parse(b).tokens and parse(a).numbers == parse(b).numbers
    assert V.explain(a, b).rule == "identical"


def test_a_scale_multiplies_only_the_number_just_before_it():
    """A scale makes one number of the number just before it, never of the 3 before that;
    "one thousand" is one number (its "one" is no pronoun)."""
    p = parse("ship 3 crates and one thousand boxes")
    assert (p.numbers, p.soft_numbers) == (("1000", "3"), ())
    assert parse("firmware v10 thousand").numbers == ("10", "1000")  # a word carrying a number
    assert parse("a thousand ways").numbers == ("1000",)
    assert parse("thousand island dressing").numbers == ("1000",)  # a scale with no number before


def test_every_number_is_a_content_word():
    """A scale rewrites the number before it in place among the content words, which only
    holds if every number is one."""
    from gpucache.guard.parsing import _CONTENT, _token_uncached
    from gpucache.guard.words import NUMBER_WORDS

    for tok in [*NUMBER_WORDS, "7", "10.5", "10k", "2bn", "1st", "first", "^2"]:
        assert _token_uncached(tok)[3] == _CONTENT, tok


@pytest.mark.parametrize(
    "a, b",
    [
        ("What is 3 ^ 2?", "What is 3^2?"),
        ("What is 3 ** 2?", "What is 3^2?"),
        ("What is 3²?", "What is 3^2?"),
    ],
)
def test_a_power_is_one_however_it_is_written(a, b):
    assert parse(a).tokens == parse(b).tokens and parse(a).numbers == ("3", "^2")


def test_a_power_is_never_the_plain_number():
    verdict = V.explain("What is 3^2?", "What is 3 times 2?")
    assert verdict.rejected and verdict.rule == "numbers"


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("Summarise the 1st chapter", "Summarise the first chapter", True),
        ("Summarise chapter 1", "Summarise the first chapter", True),
        ("Summarise chapter one", "Summarise the 1st chapter", True),
        ("Summarise chapter 2", "Summarise the first chapter", False),
        ("Summarise the 2nd chapter", "Summarise the first chapter", False),
    ],
)
def test_an_ordinal_is_its_number_in_digits_words_or_plainly(a, b, same):
    assert V.explain(a, b).rejected is not same
    assert V.explain(b, a).rejected is not same


def test_a_number_is_never_read_as_its_own_last_digits():
    verdict = V.explain("What is 12 times 2?", "What is 2 times 2?")
    assert verdict.rejected and verdict.rule == "numbers"


def test_one_stands_for_a_1_the_other_prompt_writes():
    assert not V.explain("set a timer for 1 minute", "set a timer for one minute").rejected
    assert V.explain("set a timer for 2 minutes", "set a timer for one minute").rejected


def test_two_words_are_exchanged_only_when_each_takes_the_others_place():
    from gpucache.guard.parsing import exchanged

    assert exchanged(("dog", "chase", "cat"), ("cat", "chase", "dog")) == ("dog", "cat")
    assert exchanged(("dog", "chase", "cat"), ("cat", "chase", "mouse")) is None
    assert exchanged(("dog", "chase", "cat"), ("dog", "chase", "cat", "now")) is None


# The table of interchangeable words.


def test_a_prompt_is_read_through_the_table_unless_told_not_to():
    assert parse("where to purchase a used car").tokens == parse("where to buy a used car").tokens
    assert (
        parse("where to purchase a used car", False).tokens != parse("where to buy a used car", False).tokens
    )


def test_a_table_file_says_each_class_once_with_comments_anywhere():
    from gpucache.guard.parsing import parse_table
    from gpucache.guard.words import MAX_PHRASE_WORDS, stem

    text = "# a comment # with a mark\nturn on, switch on  # trailing, with # two marks\n"
    assert parse_table(text) == {("turn", "on"): "turn_on", ("switch", "on"): "turn_on"}
    longest = " ".join(["go"] * MAX_PHRASE_WORDS)
    assert parse_table(f"{longest}, leave\n")[tuple(stem(w) for w in longest.split())] == "_".join(
        longest.split()
    )
    with pytest.raises(ValueError, match="more than"):
        parse_table(f"{longest} go, leave\n")


# Antonyms are found in any form the table or the writer puts them in.


def test_every_antonym_pair_is_found_as_written():
    from gpucache.guard.shapes import split_antonym
    from gpucache.guard.words import ANTONYM_PAIRS

    for a, b in ANTONYM_PAIRS:
        assert split_antonym(parse(a).surface, parse(b).surface) is not None, (a, b)


@pytest.mark.parametrize(
    "a, b",
    [
        (
            "What happens when the server starts?",
            "What happens when the server stops?",
        ),  # as written, stemmed
        ("Where can I purchase a used car?", "Where can I sell a used car?"),  # as the table reads it
    ],
)
def test_an_opposite_is_found_through_the_table_and_in_any_form(a, b):
    assert V.explain(a, b).rule == "antonym"


# The memos keep what is short enough to keep, and nothing else.


def test_a_token_is_memoised_up_to_its_limit_and_read_in_full_beyond():
    """A hostile prompt of long distinct words cannot fill the word memos with megabytes."""
    from gpucache.guard.parsing import MEMO_MAX_TOKEN, stem_memo, token_memo

    parse("spell it")
    for length, kept in ((MEMO_MAX_TOKEN, 1), (MEMO_MAX_TOKEN + 1, 0)):
        word = "q" * length
        before = token_memo.cache_info().currsize, stem_memo.cache_info().currsize
        assert parse(f"spell {word}").content[-1] == word
        assert (
            token_memo.cache_info().currsize - before[0],
            stem_memo.cache_info().currsize - before[1],
        ) == (kept, kept), length


def test_a_prompt_is_memoised_up_to_its_limit_and_read_in_full_beyond():
    from gpucache.guard.parsing import MEMO_MAX_CHARS, parse_memo

    parse("where to buy a used car")
    for extra, kept in ((0, 1), (1, 0)):
        prompt = "where to purchase a used car " + "x" * (MEMO_MAX_CHARS - 29 + extra)
        assert len(prompt) == MEMO_MAX_CHARS + extra
        before = parse_memo.cache_info().currsize
        assert parse(prompt).tokens[:6] == parse("where to buy a used car").tokens  # the table, either way
        assert parse_memo.cache_info().currsize - before == kept


@pytest.mark.parametrize(
    "words, digits",
    [
        ("Give me twenty five ideas", "Give me 25 ideas"),
        ("Give me twenty-five ideas", "Give me 25 ideas"),
        ("I am thirty one years old", "I am 31 years old"),  # "one" here is no pronoun
        ("It costs two hundred fifty dollars", "It costs 250 dollars"),
        ("It costs one hundred and five dollars", "It costs 105 dollars"),
        ("one hundred and fifty five pages", "155 pages"),
        ("twenty five thousand steps", "25000 steps"),
        ("born in two thousand and five", "born in 2005"),
        ("twenty five hundred metres", "2500 metres"),
        ("nine hundred ninety nine trillion", "999000000000000"),
        ("Flights to twenty five cities", "Flights to 25 cities"),  # the number a directional word governs
        ("from paris to rome in twenty five minutes", "from paris to rome in 25 minutes"),  # only its own
        ("one hundred twenty five pages", "125 pages"),
        ("a hundred and five days", "a 105 days"),  # a run may start at a scale word
        ("a hundred thousand dollars", "a 100000 dollars"),
        ("a thousand five hundred miles", "a 1500 miles"),
        ("two hundred and counting down", "200 and counting down"),  # an "and" no number follows stays
    ],
)
def test_a_number_written_in_words_is_one_number(words, digits):
    a, b = parse(words, True), parse(digits, True)
    assert (a.tokens, a.numbers, a.soft_numbers, a.attachments) == (
        b.tokens,
        b.numbers,
        b.soft_numbers,
        b.attachments,
    )
    assert LexicalNearMissVerifier().explain(words, digits).rule == "identical"


@pytest.mark.parametrize(
    "words, numbers",
    [
        ("twenty twenty", ("20", "20")),  # as said: two numbers
        ("five twenty", ("20", "5")),
        ("ten five", ("10", "5")),  # a teen takes no units
        ("twenty and five", ("20", "5")),  # "and" joins a number only after a hundred or a thousand
        ("two dozen", ("12", "2")),
        ("twenty zero", ("0", "20")),  # units after a ten are one to nine
        ("twenty ten", ("10", "20")),
        ("two thousand hundred", ("100", "2000")),  # hundreds of nothing
        ("a hundred hundred", ("100", "100")),  # hundreds of hundreds are not said
        ("who scored a double hundred", ("100", "x2")),  # a multiplier is no number a scale multiplies
    ],
)
def test_number_words_that_are_said_apart_stay_apart(words, numbers):
    assert parse(words, True).numbers == numbers


def test_every_number_word_is_a_content_word_read_as_its_own_number():
    """A run of number words starts at any of them: none is a stop word or read as another."""
    from gpucache.guard.parsing import _BELOW_HUNDRED, token_memo
    from gpucache.guard.words import SCALES

    for word in [*_BELOW_HUNDRED, *SCALES]:
        canonical, hard, _, kind, _ = token_memo(word)
        assert kind == "content" and hard == (canonical,) == (
            str(_BELOW_HUNDRED.get(word, SCALES.get(word))),
        )


def test_one_is_a_pronoun_until_a_number_word_makes_it_a_number():
    assert parse("buy a new one", True).soft_numbers == ("1",)
    assert parse("one hundred", True).numbers == ("100",) and parse("one hundred", True).soft_numbers == ()
    assert parse("one and two", True).soft_numbers == ("1",)  # "and" joins none here
    assert parse("a hundred and", True).tokens == ("a", "100", "and")  # an "and" with nothing after it stays
