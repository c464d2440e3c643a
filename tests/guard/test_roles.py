"""Who does what to whom (gpucache/guard/roles.py): a passive's verb, patient and agent, an
active clause's subject and object, the roles two prompts exchange across the voice of a verb,
and a shared word that hangs from another shared head on each side."""

from __future__ import annotations

import pytest

from gpucache.guard import roles
from gpucache.guard.parsing import parse


def parsed(text: str):
    return parse(text, True)


@pytest.mark.parametrize(
    "text, passive",
    [
        ("Were the Romans conquered by the Gauls?", ("conquer", "roman", "gaul")),
        ("Was Rome conquered quickly by the Gauls?", ("conquer", "rome", "gaul")),  # an adverb between
        ("Was the city quickly invaded by the army?", ("invad", "city", "army")),  # an adverb before it
        ("Was Italy conquered by Rome?", ("conquer", "italy", "rome")),  # a name in -ly
        ("Was the family helped by the state?", ("help", "family", "state")),
        ("Was the family quickly helped by the state?", ("help", "family", "state")),
        ("Italy was quickly conquered by Rome", ("conquer", "italy", "rome")),  # the adverb after "was"
        ("Was the dog bitten by the man?", ("bit", "dog", "man")),  # an irregular participle
        ("The city was conquered by Rome", ("conquer", "city", "rome")),  # no content word two before "by"
        (
            "The ancient city was quickly conquered by Rome",
            ("conquer", "city", "rome"),
        ),  # "be" four words back
        ("Was the ancient stone city conquered by Rome?", None),  # five back: no passive
        ("Was the old stone bridge over the river destroyed by the flood?", None),  # "be" far before the verb
        ("By the way, was the city conquered by Rome?", ("conquer", "city", "rome")),  # the second "by"
        ("Was the city conquered by", None),  # no agent
        ("It was conquered by Rome", None),  # no patient
        ("Did the Romans conquer the Gauls?", None),
        ("The Romans conquered by the Gauls", None),  # no form of "be"
        ("by the way, who won", None),
        ("Rome by the Gauls", None),
    ],
)
def test_a_passive_is_its_verb_patient_and_agent(text, passive):
    assert roles._passive(parsed(text)) == passive


def test_an_active_clause_is_the_words_either_side_of_its_verb():
    assert roles._active(parsed("Did the Romans conquer the Gauls?"), "conquer") == ("roman", "gaul")
    assert roles._active(parsed("Did the Romans conquer?"), "conquer") is None  # no object
    assert roles._active(parsed("Were the Romans conquered by the Gauls?"), "conquer") is None
    assert roles._active(parsed("Did Rome quickly conquer Italy?"), "conquer") == ("rome", "italy")
    assert roles._active(parsed("Did Italy conquer Rome?"), "conquer") == ("italy", "rome")
    assert roles._active(parsed("Conquer the Gauls"), "conquer") is None  # no subject


def test_a_role_is_the_last_content_word_before_its_verb_an_adverb_passed_over_after_one():
    content = {"italy", "quickly", "rome", "family"}
    assert roles._patient(("italy", "was", "quickly"), content) == "italy"
    assert roles._patient(("was", "family"), content) == "family"
    assert roles._patient(("was", "quickly"), content) == "quickly"  # nothing before it: the role
    assert roles._patient(("was", "the"), content) is None
    assert roles._patient((), content) is None  # nothing before the verb


@pytest.mark.parametrize(
    "a, b, exchanged",
    [
        ("Did the man bite the dog?", "Was the man bitten by the dog?", ("man", "dog")),  # irregular
        ("Was the man bitten by the dog?", "Did the man bite the dog?", ("man", "dog")),  # either way round
        ("Did the dog hate the cat?", "Was the dog hated by the cat?", ("dog", "cat")),  # four letters in e
        ("Did Rome quickly conquer Italy?", "Rome was quickly conquered by Italy", ("rome", "italy")),
        ("Did Rome quickly conquer Italy?", "Italy was quickly conquered by Rome", None),  # the same roles
    ],
)
def test_the_roles_exchanged_across_the_voice_of_a_verb(a, b, exchanged):
    assert roles.voice_roles(parsed(a), parsed(b)) == exchanged


@pytest.mark.parametrize(
    "text, attached",
    [
        ("born in Paris and moved to London", {"paris": {("born", "in")}, "london": {("mov", "to")}}),
        ("flights to Paris from London", {"paris": {("flight", "to")}}),  # a chain says nothing of roles
        ("explain in detail the war", {}),  # an instruction's word is no head
        ("write about dogs in Paris", {"paris": {("dog", "in")}}),
        ("in Paris", {}),
        ("to Paris from London", {}),  # a chain from the prompt's first word
    ],
)
def test_a_word_hangs_from_the_head_before_its_directional_word(text, attached):
    assert roles._attached(parsed(text)) == attached


@pytest.mark.parametrize(
    "a, b, changed",
    [
        (
            "born in Paris and moved to London",
            "born in London and moved to Paris",
            ("london", "mov to", "born in"),
        ),
        ("born in Paris and moved to London", "born in Paris and moved to London", None),
        (
            "a bed for a dog with a sensitive stomach",
            "for a dog with a sensitive stomach, a bed",
            None,
        ),  # moved whole
        ("flights to Paris from London", "flights to London from Paris", None),  # a chain: no roles
        ("born in Paris", "Paris, where I was born", None),  # no head on one side
        # a word whose head is reached another way ("cooking for dogs" / "with dogs") is passed over,
        # and the words after it are still read
        (
            "born in Paris and moved to London, cooking for dogs",
            "born in London and moved to Paris, cooking with dogs",
            ("london", "mov to", "born in"),
        ),
    ],
)
def test_a_shared_word_that_hangs_from_another_shared_head(a, b, changed):
    assert roles.roles_changed(parsed(a), parsed(b)) == changed
