"""What the cache embeds of a prompt (request.py): country codes kept apart from pronouns,
framing cut from the ends, and the misspelling mender's candidates one edit away, each rule at
its edges (the mutation run found them unwritten)."""

from __future__ import annotations

import pytest

from gpucache.guard import request
from gpucache.guard.request import MAX_MEND_CHARS, MEMO_MAX_CHARS, one_edit, one_edit_apart, request_text


@pytest.mark.parametrize(
    "prompt, text",
    [
        ("Flights from the US to Canada", "Flights from the USA to Canada"),  # never the pronoun "us"
        ("Flights from the U.S. to Canada", "Flights from the USA to Canada"),
        ("Flights from the U.S.A. to the U.K.", "Flights from the USA to the UK"),
        ("Is the UK in the EU?", "Is the UK in the EU?"),
        ("Convert 10 US dollars to euros", "Convert 10 US dollars to euros"),  # a currency stays
    ],
)
def test_a_country_code_in_capitals_reads_as_one_form(prompt, text):
    assert request_text(prompt) == text


@pytest.mark.parametrize(
    "prompt, text",
    [
        (
            "hey, can you please tell me how to reset my password",
            "how to reset my password",
        ),  # leads, in rounds
        ("Hi! Can you tell me how to reset my password? Thanks in advance!", "how to reset my password?"),
        ("Please, how do I boil an egg", "how do I boil an egg"),
        ("how do I boil an egg thanks so much", "how do I boil an egg"),
        ("Could you please explain how to boil an egg, thanks", "how to boil an egg"),  # its comma goes too
        ("how to boil an egg - thanks!", "how to boil an egg"),
        ("how to boil an egg; thank you", "how to boil an egg"),
        ("how to boil an egg?! thanks", "how to boil an egg?!"),  # a question's own marks stay
        ("can you tell me", "tell me"),  # a lead is cut only where something follows it
        ("thanks in advance", "thanks in advance"),  # all framing: the text as it is
        ("Can you help me out? Why do cats knead blankets", "Why do cats knead blankets"),
        ("random question but why do cats knead blankets", "why do cats knead blankets"),
        ("random question: why do cats knead blankets", "why do cats knead blankets"),
        ("random question generator for a party game", "random question generator for a party game"),
        ("why do cats knead blankets? cheers mate", "why do cats knead blankets?"),
    ],
)
def test_framing_is_cut_from_both_ends(prompt, text):
    assert request_text(prompt) == text


def test_the_strings_one_edit_away_are_every_slip_of_one_letter():
    edits = one_edit("abc")
    assert {"bac", "acb"} <= edits and {"ab", "bc", "ac"} <= edits  # transposed, a letter too many
    assert {"abcd", "xabc", "abxc"} <= edits and {"abd", "xbc"} <= edits  # missing, wrong
    assert len(edits) == len(set(edits)) and "abc" not in edits and "cba" not in edits
    assert "aab" not in one_edit("aab")  # equal letters swapped are the word itself


@pytest.mark.parametrize(
    "typed, meant",
    [
        ("pyhton", "python"),  # two letters transposed
        ("untill", "until"),  # a letter too many
        ("pasword", "password"),  # a letter missing
        ("seperate", "separate"),  # a letter wrong
        ("reqest", "request"),  # the likeliest word, not the first slip ("reest": a letter dropped)
        ("adress", "address"),  # a doubled letter typed once outweighs a commoner word ("dress")
        ("acount", "account"),  # ... ("count")
        ("resett", "reset"),  # a letter typed twice outweighs a commoner word ("resent")
        ("throught", "throught"),  # "thought" or "through", about as likely: left as written
        ("nything", "nything"),  # "anything" or "nothing": left as written
        ("kubernets", "kubernets"),  # no dictionary word one edit away
    ],
)
def test_a_misspelling_is_mended_to_the_clearly_likeliest_word_or_left(typed, meant):
    assert request.mended(typed) == meant


def test_a_word_is_taken_only_at_twice_the_likelihood_of_the_next(monkeypatch):
    words = {"alpha": 0, "bravo": 0}  # two words taken as one edit from "alphaxx"
    monkeypatch.setattr(request, "dictionary", lambda: words)
    monkeypatch.setattr(request, "one_edit", lambda word: {"alpha", "bravo"})
    monkeypatch.setattr(request, "_rarest", lambda: 1)
    for first, second, taken in ((20, 10, "alpha"), (19, 10, "alphaxx"), (10, 20, "bravo")):
        words.update(alpha=first, bravo=second)
        request.mended.cache_clear()
        assert request.mended("alphaxx") == taken
    request.mended.cache_clear()


def test_a_word_seen_no_more_than_the_rarest_is_never_what_a_slip_meant(monkeypatch):
    assert request.mended("compostible") == "compostible"  # not "compossible", seen 50 times
    words = {"alpha": 50, "bravo": 51, "rarely": 50}
    monkeypatch.setattr(request, "dictionary", lambda: words)
    monkeypatch.setattr(request, "one_edit", lambda word: {"alpha"})
    request.mended.cache_clear()
    request._rarest.cache_clear()
    assert request.mended("alphaxx") == "alphaxx"  # its only candidate is as rare as the rarest
    monkeypatch.setattr(request, "one_edit", lambda word: {"bravo"})
    request.mended.cache_clear()
    assert request.mended("alphaxx") == "bravo"
    request.mended.cache_clear()
    request._rarest.cache_clear()


def test_a_doubling_slip_counts_four_times_its_frequency():
    assert request.likelihood("adress", "address", 10) == 40  # a doubled letter typed once
    assert request.likelihood("untill", "until", 10) == 40  # a letter typed twice
    assert request.likelihood("adress", "dress", 10) == 10  # a letter too many, not a doubling
    assert request.likelihood("seperate", "separate", 10) == 10


@pytest.mark.parametrize(
    "x, y, apart",
    [
        ("abcde", "abdce", True),
        ("abcde", "bacde", True),  # two neighbours transposed
        ("abcde", "abxde", True),
        ("abcde", "abcdx", True),  # one letter changed
        ("abcde", "abcdef", True),
        ("abcdef", "abcde", True),
        ("abcde", "xabcde", True),  # one more
        ("abcde", "acde", True),
        ("abcde", "abcdefg", False),
        ("abcde", "axcye", False),
        ("abcde", "adcbe", False),
        ("abcde", "abced", True),
        ("abcde", "abdcx", False),  # a swap and a change are two edits
        ("abcde", "xbcdey", False),
        ("abcde", "abcde", False),
        ("abcd", "axcde", False),  # a change and a letter more, the change at the second letter
    ],
)
def test_two_words_one_edit_apart(x, y, apart):
    assert one_edit_apart(x, y) is apart and one_edit_apart(y, x) is apart


def test_a_misspelling_is_mended_up_to_the_longest_prompt_mended():
    body = "How do I recieve a parcel?"
    at_limit = body + " " * (MAX_MEND_CHARS - len(body))
    assert request_text(at_limit).startswith("How do I receive a parcel?")
    assert request_text(at_limit + " ") == at_limit + " "  # one character more: as written
    exact = ("I recieve " + "a " * MAX_MEND_CHARS)[:MAX_MEND_CHARS]  # the mender itself, at its bound
    assert request.mend_spelling(exact).startswith("I receive")
    assert request.mend_spelling(exact + "a") == exact + "a"


def test_a_name_ending_in_a_capital_keeps_it_where_framing_is_cut_after_it():
    assert request.strip_framing("Tell me about Malcolm X, thanks") == "Tell me about Malcolm X"
    assert request.strip_framing("Tell me about Malcolm X thanks") == "Tell me about Malcolm X"


def test_a_prompt_of_the_memos_length_is_kept_and_one_longer_is_not():
    request.request_memo.cache_clear()
    request_text("x" * MEMO_MAX_CHARS)
    assert request.request_memo.cache_info().currsize == 1
    request_text("y" * (MEMO_MAX_CHARS + 1))
    assert request.request_memo.cache_info().currsize == 1


@pytest.mark.parametrize(
    "typed, read",
    [
        ("how 2 unclog a drain", "how to unclog a drain"),  # "2" for "to" before a verb
        ("How 2 discuss pay with a manager", "How to discuss pay with a manager"),  # a verb in -ss
        ("trying 2 repot a cactus", "trying to repot a cactus"),
        ("which tent is best 4 the desert", "which tent is best for the desert"),  # before a determiner
        ("forward it 2 my landlord", "forward it to my landlord"),
        ("meet b4 noon", "meet before noon"),
        ("is any1 selling", "is anyone selling"),  # whole words
        ("want 2 tickets to Lisbon", "want 2 tickets to Lisbon"),  # a plural: a count
        ("going 2 km uphill", "going 2 km uphill"),  # a measure
        ("add 4 cups of stock", "add 4 cups of stock"),  # no word that takes "to" before it
        ("read chapter 2 the night before", "read chapter 2 the night before"),  # a label's number
        ("pick 1, 2 the rest later", "pick 1, 2 the rest later"),  # a list of numbers
        ("we won 3 2 the first leg", "we won 3 2 the first leg"),  # a score
        ("chapter 2 the ending", "chapter 2 the ending"),
        ("please read chapter 2 the night before", "please read chapter 2 the night before"),
        ("4 the record, who won", "for the record, who won"),  # at the start
        ("buy a ps5 4 the kids", "buy a ps5 for the kids"),  # a name ending in a digit is no number
    ],
)
def test_a_number_typed_for_a_word_is_read_as_the_word_only_where_no_count_can_stand(typed, read):
    assert request.expand_shorthand(typed) == read
