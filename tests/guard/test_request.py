"""What the cache embeds of a prompt (request.py): country codes kept apart from pronouns,
framing cut from the ends, and the misspelling mender's candidates one edit away, each rule at
its edges (the mutation run found them unwritten)."""

from __future__ import annotations

from collections import Counter

import pytest

from gpucache.guard import request
from gpucache.guard.request import MAX_MEND_CHARS, MEMO_MAX_CHARS, one_edit, one_edit_apart, request_text


@pytest.mark.parametrize("prompt, text", [
    ("Flights from the US to Canada", "Flights from the USA to Canada"),  # never the pronoun "us"
    ("Flights from the U.S. to Canada", "Flights from the USA to Canada"),
    ("Flights from the U.S.A. to the U.K.", "Flights from the USA to the UK"),
    ("Is the UK in the EU?", "Is the UK in the EU?"),
    ("Convert 10 US dollars to euros", "Convert 10 US dollars to euros"),  # a currency stays
])
def test_a_country_code_in_capitals_reads_as_one_form(prompt, text):
    assert request_text(prompt) == text


@pytest.mark.parametrize("prompt, text", [
    ("hey, can you please tell me how to reset my password", "how to reset my password"),  # leads, in rounds
    ("Hi! Can you tell me how to reset my password? Thanks in advance!", "how to reset my password?"),
    ("Please, how do I boil an egg", "how do I boil an egg"),
    ("how do I boil an egg thanks so much", "how do I boil an egg"),
    ("Could you please explain how to boil an egg, thanks", "how to boil an egg"),  # its comma goes too
    ("how to boil an egg - thanks!", "how to boil an egg"),
    ("how to boil an egg; thank you", "how to boil an egg"),
    ("how to boil an egg?! thanks", "how to boil an egg?!"),  # a question's own marks stay
    ("can you tell me", "tell me"),  # a lead is cut only where something follows it
    ("thanks in advance", "thanks in advance"),  # all framing: the text as it is
])
def test_framing_is_cut_from_both_ends(prompt, text):
    assert request_text(prompt) == text


def test_the_strings_one_edit_away_are_ranked_as_typing_slips_are_common():
    kinds = Counter(kind for kind, _ in one_edit("abc"))
    assert kinds == {0: 2, 1: 3, 2: 4 * 26, 3: 3 * 25}  # transposed, too many, missing, wrong
    edits = dict((w, kind) for kind, w in one_edit("abc"))
    assert edits["bac"] == edits["acb"] == 0 and edits["ab"] == edits["bc"] == 1
    assert edits["abcd"] == edits["xabc"] == 2 and edits["abd"] == edits["xbc"] == 3
    assert [w for kind, w in one_edit("aab") if kind == 0] == ["aba"]  # equal letters: no swap
    assert "aab" not in dict((w, k) for k, w in one_edit("aab"))


@pytest.mark.parametrize("x, y, apart", [
    ("abcde", "abdce", True), ("abcde", "bacde", True),  # two neighbours transposed
    ("abcde", "abxde", True), ("abcde", "abcdx", True),  # one letter changed
    ("abcde", "abcdef", True), ("abcdef", "abcde", True), ("abcde", "xabcde", True),  # one more
    ("abcde", "acde", True),
    ("abcde", "abcdefg", False), ("abcde", "axcye", False), ("abcde", "adcbe", False),
    ("abcde", "abced", True), ("abcde", "abdcx", False),  # a swap and a change are two edits
    ("abcde", "xbcdey", False), ("abcde", "abcde", False),
    ("abcd", "axcde", False),  # a change and a letter more, the change at the second letter
])
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
