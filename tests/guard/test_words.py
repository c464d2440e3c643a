"""The words the guard knows: the light stemmer, rule by rule, and the word files it ships,
each read afresh into what the guard uses (a table built when the module is imported is never
re-read by a test that only asks a verdict: the mutation run found every reader untested)."""

from __future__ import annotations

import pytest

from gpucache.guard import differences, request, words
from gpucache.guard.words import stem


@pytest.mark.parametrize(
    "word, stemmed",
    [
        ("cities", "city"),
        ("flies", "fly"),  # "ies" is "y" from five letters
        ("ties", "tie"),  # a shorter one loses its "s" only
        ("resetting", "reset"),
        ("getting", "get"),
        ("stopped", "stop"),
        ("planned", "plan"),
        ("added", "add"),
        ("adding", "add"),
        ("erred", "err"),  # a three-letter root keeps its double
        ("sued", "sue"),
        ("used", "use"),
        ("tied", "tie"),
        ("dyed", "dye"),
        ("owed", "owe"),  # root in "e"
        ("feed", "feed"),
        ("need", "need"),
        ("bled", "bled"),
        ("shed", "shed"),  # "fee", "ble": no root
        ("calling", "call"),
        ("passed", "pass"),
        ("buzzed", "buzz"),  # l, s and z double in roots
        ("sing", "sing"),
        ("bring", "bring"),  # "ing" from six letters
        ("boxes", "box"),
        ("wishes", "wish"),
        ("churches", "church"),
        ("buzzes", "buzz"),
        ("classes", "class"),
        ("asses", "ass"),  # "es" after the sounds that take it
        ("tomatoes", "tomatoe"),
        ("goes", "goe"),  # after any other, only the "s"
        ("cats", "cat"),
        ("resets", "reset"),
        ("glass", "glass"),
        ("status", "status"),
        ("analysis", "analysis"),  # no "s" to take off
        ("bus", "bus"),
        ("was", "was"),
        ("its", "its"),  # three letters: whole
        ("c3pos", "c3pos"),
        ("x-rays", "x-rays"),  # not a word of letters: as written
    ],
)
def test_a_word_loses_the_ending_its_rule_names(word, stemmed):
    assert stem(word) == stemmed


def test_an_inflected_verb_and_its_root_stem_alike():
    for forms in (
        ("add", "adds", "added", "adding"),
        ("reset", "resets", "resetting"),
        ("stop", "stops", "stopped", "stopping"),
        ("call", "calls", "called", "calling"),
        ("sue", "sues", "sued"),
        ("use", "uses", "used"),
    ):
        assert {stem(f) for f in forms} == {forms[0]}, forms


def test_the_confusables_file_is_read_into_groups_of_casefolded_words():
    groups = words._confusable_pairs()
    assert groups == words.CONFUSABLE_GROUPS
    assert groups[:3] == (("desert", "dessert"), ("affect", "effect"), ("accept", "except"))
    assert all(
        len(g) >= 2 and all(w == w.strip().casefold() and w and "#" not in w for w in g) for g in groups
    )
    assert words.CONFUSABLE["dessert"] == {"desert"}


def test_the_categories_file_is_read_into_its_kinds_stemmed():
    kinds = differences._categories()
    assert kinds == differences.CATEGORIES and tuple(kinds) == differences.KINDS
    assert {"python", "c++", "postgresql"} <= kinds["entity"]
    assert "beij" in kinds["entity"]  # "beijing", stemmed as every prompt's words are
    assert all(w == w.casefold() and "#" not in w for kind in kinds.values() for w in kind)


def test_the_shorthand_file_is_read_into_whole_words_written_out():
    shorthand = request._shorthand()
    assert shorthand == request.SHORTHAND
    assert shorthand["u"] == "you" and shorthand["w/o"] == "without" and shorthand["ty"] == "thank you"
    assert all(k == k.casefold() and k and v and "#" not in k + v for k, v in shorthand.items())


def test_the_framing_file_is_read_section_by_section_without_its_comments():
    for name, patterns in (("segment", request.SEGMENTS), ("lead", request.LEADS), ("tail", request.TAILS)):
        again = request._patterns(name)
        assert [p.pattern for p in again] == [p.pattern for p in patterns] and again, name
        assert not any(p.pattern.startswith("#") or not p.pattern.strip() for p in again)
    assert request.SEGMENTS[0].fullmatch("hello there")
    assert request._patterns("no such section") == []


@pytest.mark.parametrize("line", ["u", "u,", ", you", "u , "])
def test_a_shorthand_line_without_both_forms_is_named(line):
    with pytest.raises(ValueError, match=rf"shorthand.txt line 2: expected 'short, long': {line.strip()!r}"):
        request._shorthand("# a comment\n" + line + "\n")


def test_a_shorthand_line_reads_its_first_comma_and_drops_its_comment():
    assert request._shorthand("\nU ,  you all # the plural\nw/, with\n") == {"u": "you all", "w/": "with"}
    assert request._shorthand("u, you # a comment # with a second mark\n") == {"u": "you"}  # from the first
    assert request._shorthand("a, b, c\n") == {"a": "b, c"}


def test_a_category_section_must_be_a_known_kind_and_words_before_any_section_are_none():
    with pytest.raises(ValueError, match=r"categories.txt: unknown section \[colour\]"):
        differences._categories("[entity]\npython\n[colour]\nred\n")
    kinds = differences._categories("stray words\n[entity]\nPython  Beijing # comment\n[tone]\n")
    assert kinds == {"entity": frozenset({"python", "beij"}), "tone": frozenset()}
    kinds = differences._categories("[entity]\nPython # a comment # with a second mark\n")
    assert kinds == {"entity": frozenset({"python"})}  # a comment starts at the first mark
    with pytest.raises(ValueError, match=r"bracketed at both ends: \[entity"):
        differences._categories("[entity\npython\n")  # not a line of words, nor read as one
    with pytest.raises(ValueError, match=r"bracketed at both ends: entity\]"):
        differences._categories("[tone]\nentity]\n")


def test_a_confusables_line_is_one_group_and_drops_its_comment():
    assert words._confusable_pairs("# groups\n Affect, effect # verb / noun\n\nfrom,form\n") == (
        ("affect", "effect"),
        ("from", "form"),
    )
    assert words._confusable_pairs("bear, beer # a comment # with a second mark\n") == (("bear", "beer"),)


@pytest.mark.parametrize(
    "word, is_adverb",
    [("badly", True), ("automatically", True), ("ugly", False), ("fly", False), ("lying", False)],
)
def test_an_adverb_is_a_word_of_five_letters_or_more_in_ly(word, is_adverb):
    assert words.adverb(word) is is_adverb


def test_a_framing_section_is_its_own_lines_only():
    text = "stray\n[lead]\n# a comment\n  hello  \n\n[tail]\nthanks\n[lead]\nhi\n"
    assert [p.pattern for p in request._patterns("lead", text)] == ["hello", "hi"]
    assert [p.pattern for p in request._patterns("tail", text)] == ["thanks"]
