"""The redesigned guard, kind by kind: each named difference refuses its pairs and only that
rule does (each case fails with its rule switched off), and each kind of rewording people type
passes to the threshold (each case fails if any rule refuses it)."""

from __future__ import annotations

import pytest

from gpucache import LexicalNearMissVerifier
from gpucache.guard import differences
from gpucache.guard.parsing import parse

V = LexicalNearMissVerifier()

# (cached, new, the rule that names the difference)
NAMED = [
    ("Is the sum of -4 and 9 positive?", "Is the sum of 4 and 9 positive?", "numbers"),
    ("Dose of vitamin B12 in mcg for adults", "Dose of vitamin B12 in mg for adults", "confusable"),
    ("Which wines go with a chocolate dessert?", "Which wines go with a chocolate desert?", "confusable"),
    ("Did the Normans invade the Saxons?", "Were the Normans invaded by the Saxons?", "voice"),
    ("Did the family sue the city?", "Was the family sued by the city?", "voice"),  # a patient in -ly
    ("Did the Normans invade the Saxons?", "Were the Saxons invaded by the Normans?", None),
    ("What is 30 percent of 90?", "What percentage of 90 is 30?", "relation"),
    ("select users where admin and active", "select users where admin or active", "relation"),
    ("Plan a weekend in Lisbon", "Plan a weekend in Porto", "entity"),
    ("plan a weekend in lisbon", "plan a weekend in porto", "substitution"),
    (
        "Outline the causes of inflation as an essay",
        "Outline the causes of inflation as a checklist",
        "deliverable",
    ),
    ("Describe how vaccines work for nurses", "Describe how vaccines work for toddlers", "audience"),
    ("Draft a sarcastic reply to this review", "Draft a polite reply to this review", "tone"),
    ("What were the best-selling sedans last year?", "What were the best-selling sedans next year?", "time"),
    ("Suggest a lasagna recipe", "Suggest a lasagna recipe without cheese", "constraint"),
    ("Suggest a lasagna recipe", "Suggest a lasagna recipe for a vegan", "constraint"),
    ("She was born in Oslo and studied in Bergen", "She was born in Bergen and studied in Oslo", "swapped"),
    (
        "She was born in Oslo and studied in Bergen",
        "She studied law in Oslo after she was born in Bergen",
        "crossed",
    ),
    # a number or a "not" in context told before the request is no difference; a qualifier is
    (
        "Been fighting this for 3 hours and it still won't work. How do I undo a git rebase?",
        "How do I undo a git rebase?",
        None,
    ),
    (
        "I'm vegan. What should I cook for dinner tonight?",
        "What should I cook for dinner tonight?",
        "constraint",
    ),
    ("How do I undo a git rebase?", "How do I undo a git rebase? Show the reflog commands too.", "added"),
]

# (cached, new): the same request, typed another way
PASS_THROUGH = {
    "typo": [
        ("how do I configure a reverse proxy", "how do I configrue a reverse porxy"),
        ("recommend a thermometer for roasting", "recomend a thermometer for roastting"),
    ],
    "shorthand": [
        ("Can you tell me about the history of jazz, please?", "pls tell me abt history of jazz"),
        ("what to pack for a trip with a baby", "what to pack for trip w/ baby"),
    ],
    "wrapper": [
        ("how do I descale a kettle", "Hi there! Quick question: how do I descale a kettle? Thanks!"),
        (
            "what is a mortgage escrow account",
            "Sorry if this is a dumb question, but what is a mortgage escrow account? thanks in advance",
        ),
    ],
    "synonym": [("best film about chess", "good movie about chess")],
    "reorder": [
        (
            "My parcel was lost by the courier, can I claim a refund?",
            "The courier lost my parcel, can I claim a refund?",
        ),
        (
            "For a beginner with a small budget, which telescope is best?",
            "Which telescope is best for a beginner with a small budget?",
        ),
    ],
}


@pytest.mark.parametrize("cached, new, rule", NAMED)
def test_each_named_difference_refuses_by_its_own_rule(cached, new, rule):
    for a, b in ((cached, new), (new, cached)):
        verdict = V.explain(a, b)
        if rule is None:
            assert not verdict.rejected, verdict
        else:
            assert verdict.rejected and verdict.rule == rule, verdict


@pytest.mark.parametrize("cached, new, rule", [c for c in NAMED if c[2]])
def test_with_its_rule_switched_off_the_difference_is_not_refused_by_it(cached, new, rule):
    verdict = LexicalNearMissVerifier(skip=(rule,)).explain(cached, new)
    assert verdict.rule != rule


@pytest.mark.parametrize(
    "kind, cached, new", [(k, a, b) for k, pairs in PASS_THROUGH.items() for a, b in pairs]
)
def test_each_kind_of_rewording_passes_to_the_threshold(kind, cached, new):
    for a, b in ((cached, new), (new, cached)):
        verdict = V.explain(a, b)
        assert not verdict.rejected, (kind, verdict)


def test_the_request_read_drops_framing_at_both_ends_and_nothing_in_the_middle():
    assert (
        V.request("hey, quick question, how can I reset my password? thanks!")
        == "how can I reset my password?"
    )
    assert V.request("how do i resett my pasword") == "how do i reset my password"
    assert V.request("can u pls explain recursion w/ an example thx") == "explain recursion with an example"
    pasted = "Summarize this: 'Thanks for coming. Hi to all.' Thanks!"
    assert V.request(pasted) == "Summarize this: 'Thanks for coming. Hi to all.'"
    assert V.request("thanks!") == "thanks!"  # a prompt that is all framing is kept whole


def test_words_a_letter_apart_that_are_both_words_are_never_mended():
    assert V.request("recipe for a chocolate desert") == "recipe for a chocolate desert"
    assert V.request("how to merge two dicts") == "how to merge two dicts"  # short words stay


def test_a_word_longer_than_any_in_the_dictionary_is_never_mended(monkeypatch):
    """No dictionary word is one edit from it, and the strings one edit away from a word of n
    letters are 54n of n letters each: a hostile 20,000-letter word would be gigabytes."""
    from gpucache.guard import request

    assert max(map(len, request.dictionary())) + 1 < request.MEND_MAX_LETTERS
    monkeypatch.setattr(request, "one_edit", lambda word: pytest.fail(f"mending a {len(word)}-letter word"))
    long_word = "pneumonoultramicroscopicsilicovolcanoconiosiss" * 400
    assert V.request("define it please") == "define it"
    words_kept = request.mended.cache_info().currsize
    assert V.request(f"define {long_word} please") == f"define {long_word}"
    assert request.mended.cache_info().currsize == words_kept
    assert request.mended("x" * (request.MEND_MAX_LETTERS + 1)) == "x" * (request.MEND_MAX_LETTERS + 1)


def test_misspellings_are_matched_to_the_other_side_when_no_dictionary_knows_either():
    a, b = differences.reconcile("deploy with kubernetes", "deploy with kubernets")
    assert parse(a).tokens == parse(b).tokens
    # both are words: a difference, left as written
    assert differences.reconcile("pack a desert", "pack a dessert") == ("pack a desert", "pack a dessert")


def test_the_category_lists_load_and_name_their_kinds():
    assert set(differences.CATEGORIES) == set(differences.KINDS)
    assert differences.kind_of("haiku", frozenset()) == "deliverable"
    assert differences.kind_of("formally", frozenset()) == "tone"
    assert differences.kind_of("lyon", frozenset({"lyon"})) == "entity"


def words_of(text: str) -> str:
    """A text as the segment rules compare it here: its words, casefolded."""
    return " ".join(text.casefold().replace(".", " ").split())


@pytest.mark.parametrize(
    "a, b, rests",
    [
        (
            "Shared one. Alpha here. Shared two.",
            "Shared one. Bravo there. Shared two.",
            ("Alpha here.", "Bravo there."),
        ),
        (
            "Shared one. Alpha here.",
            "Shared one. Bravo there.",
            ("Alpha here.", "Bravo there."),
        ),  # shared start only
        (
            "Alpha here. Shared two.",
            "Bravo there. Shared two.",
            ("Alpha here.", "Bravo there."),
        ),  # shared end only
        ("S1. S2. Alpha. S3.", "S1. S2. Bravo. Charlie. S3.", ("Alpha.", "Bravo. Charlie.")),
        ("S1. Alpha. Bravo.", "S1. Charlie. Bravo.", ("Alpha.", "Charlie.")),
        ("Alpha here.", "Bravo there.", None),  # nothing shared
        ("Shared one. Alpha here.", "Shared one.", None),  # one side has nothing left: extra_segments' case
        ("Shared one. Shared two.", "Shared one. Shared two.", None),
        ("Alpha. S1. S2.", "Bravo. S1. S2.", ("Alpha.", "Bravo.")),  # two shared at the end
        # the shared end is trimmed from the ends inward, never across to a sentence that moved
        ("Moved. Alpha. End.", "Bravo. Moved. End.", ("Moved. Alpha.", "Bravo. Moved.")),
        ("Bravo. Moved. End.", "Moved. Alpha. End.", ("Bravo. Moved.", "Moved. Alpha.")),
    ],
)
def test_the_sentences_that_differ_between_shared_ones(a, b, rests):
    assert differences.differing_segments(a, b, words_of) == rests


@pytest.mark.parametrize(
    "a, b, extra",
    [
        ("Context first. The request.", "The request.", ("lead", ("Context first.",))),
        ("The request.", "The request. More asked.", ("tail", ("More asked.",))),
        ("The request.", "The request.", None),
        ("The request.", "Other thing. Another thing.", None),
        (
            "Context first. The request. Its detail.",
            "The request. Its detail.",
            ("lead", ("Context first.",)),
        ),
    ],
)
def test_the_whole_sentences_one_text_has_more(a, b, extra):
    assert differences.extra_segments(a, b, words_of) == extra


@pytest.mark.parametrize(
    "a, b",
    [
        ("How do I deploy on kubernetes?", "How do I deploy on Kubernets?"),  # as typed, capital and all
        ("deploy kubernetes with helmchart", "deploy Kubernets with helmchrt"),  # each word its own
    ],
)
def test_a_misspelling_no_dictionary_knows_is_written_as_the_other_sides_word(a, b):
    assert differences.reconcile(a, b) == (a, a)


def test_misspellings_are_mended_only_where_at_most_400_pairs_of_words_differ():
    """The pass compares each word one side has with each the other lacks: bounded, so a long
    prompt against another costs no more than 400 comparisons (past it, left as typed)."""
    letters = "bcdfghjklmnpqrstvwxz"
    filler_a = [f"ya{x}{y}o" for x in letters for y in letters]
    filler_b = [f"uo{x}{y}e" for x in letters for y in letters]

    def mended(differ_a: int, differ_b: int) -> bool:
        a = "deploy on kubernetes " + " ".join(filler_a[: differ_a - 1])
        b = "deploy on kubernets " + " ".join(filler_b[: differ_b - 1])
        return "kubernetes" in differences.reconcile(a, b)[1]

    assert mended(20, 20) and mended(1, 400)
    assert not mended(20, 21) and not mended(1, 401)


def test_words_that_are_no_misspelling_of_each_other_are_left_as_typed():
    assert differences.reconcile("deploy on kubernetes", "deploy on nomad") == (
        "deploy on kubernetes",
        "deploy on nomad",
    )


def parsed(text: str):
    return parse(text, True)


@pytest.mark.parametrize(
    "text, only, alone, span",
    [
        ("How do I bake bread without eggs", ("egg",), False, ("egg",)),  # opened by a restricting word
        ("How do I bake egg bread", ("egg",), False, ()),  # standing elsewhere
        ("cake without eggs for my kids", ("egg", "kid"), False, ("egg", "kid")),
        ("cake without eggs, bread for kids", ("egg", "kid"), False, ("egg",)),  # a shared word closes it
        ("bread without eggs or milk", ("egg", "milk"), False, ("egg", "milk")),
        ("How do I bake bread in a cast iron pot", ("cast", "iron", "pot"), True, ("cast", "iron", "pot")),
        ("How do I bake bread in a cast iron pot", ("cast", "iron", "pot"), False, ()),  # closing: only alone
        ("bread", (), True, ()),
        # each added word is read as often as it was added: a second "eggs" is a shared word
        ("a cake without eggs, then eggs for breakfast", ("egg",), False, ("egg",)),
        ("a cake without eggs and a pie without eggs", ("egg", "egg"), False, ("egg", "egg")),
        ("a cake without eggs and a pie without eggs", ("egg",), False, ("egg",)),
    ],
)
def test_the_qualifier_one_prompt_adds(text, only, alone, span):
    assert differences.restricted_span(parsed(text), only, alone=alone) == span


def test_a_named_kind_read_through_its_adverb_only_past_five_letters():
    assert differences.kind_of("highly", frozenset()) == differences.KIND_OF["high"]
    assert differences.kind_of("lowly", frozenset()) is None  # five letters: a word of its own
    assert differences.kind_of("lyonly", frozenset({"lyon"})) is None  # names are read as written
    assert differences.kind_of("zzzz", frozenset()) is None


def test_the_words_left_over_are_the_last_occurrences_in_prompt_order():
    from collections import Counter

    assert differences._in_order(("a", "b", "a", "c", "b"), Counter({"a": 1, "b": 1})) == ["a", "b"]
    assert differences._in_order(("a", "b", "a"), Counter({"a": 2})) == ["a", "a"]
    assert differences._in_order(("a", "b"), Counter()) == []


@pytest.mark.parametrize(
    "a, b, changed",
    [
        ("20 percent of 50", "what percentage of 50 is 20", True),
        ("what percentage of 50 is 20", "20 percent of 50", True),  # either way round
        ("20% of 50", "what percent of 50 is 20", True),
        ("20 percent of 50", "30 percent of 50", False),  # given in both
        ("what percent of 50 is 20", "What percentage of 50 is 20", False),  # asked in both
    ],
)
def test_a_percentage_asked_in_one_prompt_and_given_in_the_other(a, b, changed):
    assert differences.percent_relation(a, b) is changed


@pytest.mark.parametrize(
    "a, b, changed",
    [
        ("rows where x and y", "rows where x or y", True),
        ("on PS5 or PC", "on PS5 and PC", True),
        ("cats and dogs", "cats and dogs", False),
        ("cats or dogs", "dogs and cats", False),  # other words joined
        ("and x", "or x", False),  # nothing before the joining word
        ("x and", "x or", False),  # nothing after it
        ("cats and dogs", "birds or dogs", False),  # the word before differs
        ("cats and dogs", "cats or birds", False),  # the word after differs
        ("I like cats and dogs", "I love cats or dogs", True),  # the words around the pair differ
    ],
)
def test_the_same_two_words_joined_by_and_in_one_and_or_in_the_other(a, b, changed):
    assert differences.coordination_changed(parsed(a), parsed(b)) is changed


@pytest.mark.parametrize(
    "text, only, span",
    [
        ("bake bread in a cast iron pot", ("cast", "iron", "pot"), ("cast", "iron", "pot")),
        ("bake bread that runs linux", ("run", "linux"), ("run", "linux")),
        ("bake bread in a cast iron pot", ("pot",), ()),  # not every word after the last shared one is added
        ("bake bread in a pot today", ("pot",), ()),  # a shared word after it
        ("bake in a pot bread", ("pot",), ()),
        ("bake bread pot in a", ("pot",), ()),  # the restricting word after the added word
        ("bake bread bread in a bread pot", ("bread", "pot"), ()),  # one "bread" is shared, and the last
        ("bread bake in a bread pot", ("bread", "pot"), ()),  # the second "bread" is the shared one
        ("bake fresh bread in a pot", ("fresh", "pot"), ()),  # an added word before the last shared one
        ("pasta with cheese sauce", ("sauce",), ()),  # "with" opens the shared word's phrase
        ("in a cast iron pot", ("cast", "iron", "pot"), ("cast", "iron", "pot")),  # nothing shared
    ],
)
def test_the_qualifier_that_closes_a_prompt(text, only, span):
    assert differences._trailing_span(parsed(text), only) == span


def test_two_prompts_aligned_are_the_words_each_adds_and_how_many_they_share():
    """Framing words ("explain") are set aside from what differs and from the shared count,
    and counted in ``framed``; a word led by a digit is the numbers rule's, not compared here."""
    assert differences.align(
        parsed("explain how a mutex locks a thread"), parsed("explain how a semaphore locks a thread")
    ) == differences.Difference(("mutex",), ("semaphore",), shared=2, framed=3)
    assert differences.align(parsed("buy a 5g phone"), parsed("buy a phone")) == differences.Difference(
        (), (), shared=2, framed=2
    )
