"""The edits that make training pairs (gpucache/pairing/training/edits.py): each a pure function
of the prompt and a seeded generator, rewordings labelled 1 and near-misses 0."""

from __future__ import annotations

import random

import pytest

from gpucache.pairing.training import edits


@pytest.mark.parametrize(
    "edit, prompt, expected",
    [
        (edits.opposite, "how do I increase my overdraft limit", "how do I decrease my overdraft limit"),
        (edits.opposite, "can I withdraw cash abroad", "can I deposit cash abroad"),  # read both ways
        (edits.prefixed, "is my card still valid", "is my card still invalid"),
        (edits.prefixed, "tax rules if I'm employed", "tax rules if I'm self-employed"),
        (edits.negated, "why is my transfer pending", "why isn't my transfer pending"),
        (edits.negated, "I can log in on my phone", "I can't log in on my phone"),
        (edits.negated, "why is my transfer not pending", "why is my transfer pending"),
        (
            edits.redirected,
            "fees to send money from the UK to Spain",
            "fees to send money from Spain to the UK",
        ),
    ],
)
def test_a_near_miss_edit_changes_the_one_word_it_names(edit, prompt, expected):
    assert edit(prompt, random.Random(0)) == expected


def test_an_edit_that_does_not_apply_makes_nothing():
    rng = random.Random(0)
    assert edits.opposite("what is my sort code", rng) is None
    assert edits.renumbered("what is my sort code", rng) is None
    assert edits.redirected("what is my sort code", rng) is None


def test_the_pairs_of_a_prompt_are_the_same_for_one_seed_and_labelled_by_kind():
    prompt = "How do I increase the limit on my 2 cards?"
    first = edits.edited(prompt, random.Random(7))
    assert first == edits.edited(prompt, random.Random(7))
    assert [label for _, _, label in first] == [1, 0]
    assert all(a == prompt and b != prompt for a, b, _ in first)
    made = {b for seed in range(40) for _, b, _ in edits.edited(prompt, random.Random(seed))}
    assert len(made) > 10  # the seed chooses among the edits


def test_a_misspelling_keeps_the_words_count_and_changes_one_or_two_of_them():
    prompt = "Where should I report a fraudulent transaction"
    for seed in range(20):
        typo = edits.misspelled(prompt, random.Random(seed))
        changed = [x for x, y in zip(prompt.split(), typo.split()) if x != y]
        assert len(typo.split()) == len(prompt.split()) and 1 <= len(changed) <= 2
