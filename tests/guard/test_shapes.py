"""The shape rules' parts, each at the edges its docstring states: one longest increasing
subsequence, forms of one word, the substitutions that align two prompts, and shared words
moved (the mutation run found each edge unwritten)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucache.guard.parsing import parse
from gpucache.guard.shapes import (
    coordinated,
    crossed,
    joined,
    one_increasing_subsequence,
    reordered,
    substitutions,
    variants,
)


def longest_increasing(xs: list[int]) -> int:
    best = [1] * len(xs)
    for i in range(len(xs)):
        for j in range(i):
            if xs[j] < xs[i]:
                best[i] = max(best[i], best[j] + 1)
    return max(best, default=0)


@given(st.lists(st.integers(-50, 50), unique=True, max_size=12))
def test_the_kept_values_are_one_longest_increasing_subsequence(xs):
    kept = one_increasing_subsequence(xs)
    in_order = [x for x in xs if x in kept]
    assert in_order == sorted(in_order) and len(kept) == longest_increasing(xs)


def test_an_increasing_subsequence_in_examples():
    assert one_increasing_subsequence([]) == set()
    assert one_increasing_subsequence([3]) == {3}
    assert one_increasing_subsequence([2, 0, 1, 3]) == {0, 1, 3}
    assert one_increasing_subsequence([0, 4, 1, 2, 3]) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    "x, y, same",
    [
        ("help", "helpful", True),  # a prefix of four letters
        ("hel", "helpful", False),  # of three: no
        ("dat", "date", True),
        ("movie", "movies", True),  # one root ("dating" stems to "dat")
        ("abcdefg", "abcdefxy", True),  # six letters in common, 6/7 of the shorter
        ("abcdefghij", "abcdefghxy", True),  # eight of ten: exactly 80%
        ("abcdefghij", "abcdefgxyz", False),  # seven of ten: under 80%
        ("abcdefz", "abcdefaaaa", True),  # the shorter word's share, whichever sorts first
        ("abcdex", "abcdey", False),  # five in common: too few
        ("internship", "internet", False),
        ("film", "movie", True),  # one interchangeable class
        ("c3po", "c3pox", False),  # not letters
    ],
)
def test_two_forms_of_one_word(x, y, same):
    assert variants(x, y) is same and variants(y, x) is same


@pytest.mark.parametrize(
    "a, b, subs",
    [
        (("reset", "password"), ("reset", "username"), [("password", "username")]),
        (("password",), ("username",), []),  # nothing in common: not one prompt edited
        (("a", "b", "c", "d"), ("a", "x", "y", "d"), [("b c", "x y")]),  # two words for two
        (("a", "b", "c", "d"), ("a", "x", "y", "z", "d"), []),  # three for two: more than a swap
        (("a", "b", "c", "e", "d"), ("a", "x", "y", "d"), []),
        (("good", "film"), ("good", "movie"), []),  # forms of one word, or one class
        (("web", "site", "design"), ("website", "design"), []),  # one word joined
        # a form of one word or a joined word at the front, a substitution after them
        (
            ("help", "me", "reset", "password"),
            ("helpful", "me", "reset", "username"),
            [("password", "username")],
        ),
        (("multi", "year", "me", "password"), ("multiyear", "me", "username"), [("password", "username")]),
        # ... and after them (a word's form beside a substitution, wherever each stands)
        (("reset", "my", "help"), ("change", "my", "helpful"), [("reset", "change")]),
        # a word added before and another dropped after is more than a swap (the ends that match
        # are trimmed from the ends inward, never across)
        (("reset", "now", "password"), ("please", "reset", "password"), []),
        ((), ("x",), []),
    ],
)
def test_the_substitutions_that_align_two_prompts(a, b, subs):
    assert substitutions(a, b) == subs


def moved(a: str, b: str) -> tuple[str, ...]:
    return reordered(parse(a, True), parse(b, True))


@pytest.mark.parametrize(
    "a, b, words",
    [
        # five shared words are enough, four are not
        ("alpha bravo charlie delta echo", "bravo alpha charlie delta echo", ("alpha",)),
        ("alpha bravo charlie delta", "bravo alpha charlie delta", ()),
        # the shared words must be 60% of all: 6 of 10 are, 6 of 11 are not
        (
            "alpha bravo charlie delta echo foxtrot",
            "bravo alpha charlie delta echo foxtrot golf hotel india juliet",
            ("alpha",),
        ),
        (
            "alpha bravo charlie delta echo foxtrot",
            "bravo alpha charlie delta echo foxtrot golf hotel india juliet lima",
            (),
        ),
        # a word under the same directional word on both sides has moved with it, and so has the
        # word after it in a prompt of fewer than 8 shared words ("at room temperature" fronted)
        (
            "alpha delta bravo echo golf in charlie foxtrot",
            "in charlie foxtrot alpha bravo delta echo golf",
            ("delta",),
        ),
        (
            "alpha delta bravo echo golf hotel in charlie foxtrot",
            "in charlie foxtrot alpha bravo delta echo golf hotel",
            ("delta", "foxtrot"),
        ),
        # the phrase passed over as moved whole, the words after it are still read
        (
            "in charlie foxtrot alpha delta bravo echo golf",
            "alpha bravo delta echo golf in charlie foxtrot",
            ("delta",),
        ),
        (
            "alpha delta bravo echo golf hotel with charlie foxtrot",
            "in charlie foxtrot alpha bravo delta echo golf hotel",
            ("delta", "charlie", "foxtrot"),
        ),
    ],
)
def test_shared_words_moved(a, b, words):
    assert moved(a, b) == words


@pytest.mark.parametrize(
    "a, b, one_word",
    [
        (("inbox",), ("in", "box"), True),
        (("in", "box"), ("inbox",), True),  # either side
        (("into",), ("in", "to"), False),  # four letters: two short words of their own
        (("inbox",), ("in", "bo"), False),
        (("inbox",), ("inbox",), False),
    ],
)
def test_one_word_of_five_letters_or_more_written_apart_on_the_other_side(a, b, one_word):
    assert joined(a, b) is one_word


def test_a_number_is_never_coordinated_even_with_a_word():
    assert coordinated(("python", "or", "java"), "python", "java")
    assert not coordinated(("divide", "10", "and", "apples"), "10", "apples")
    assert not coordinated(("divide", "apples", "and", "10"), "apples", "10")


def test_nothing_substitutes_for_an_empty_side():
    assert substitutions((), ("x",)) == [] and substitutions(("x",), ()) == []


@pytest.mark.parametrize(
    "a, b, pair",
    [
        ("miles to km", "km to miles", ("mi", "km")),  # two shared words are enough
        # the first pair crossed, read past a pair kept in order
        ("travel from Paris via Lyon to Rome", "travel from Rome to Paris via Lyon", ("paris", "rome")),
        (
            "convert 100 euros to dollars for my summer trip budget today please",  # eight content words
            "convert 100 dollars to euros for my summer trip budget today please",
            ("eur", "usd"),
        ),
        (
            "convert 100 euros to dollars for my long summer trip budget today please",  # nine: abstains
            "convert 100 dollars to euros for my long summer trip budget today please",
            None,
        ),
        ("upgrade from 4g to 5g", "upgrade from 5g to 4g", None),  # number-led words: the numbers rule's
    ],
)
def test_two_shared_words_crossed_over_a_directional_word(a, b, pair):
    assert crossed(parse(a), parse(b)) == pair
