"""The learned decision (gpucache/guard/learned.py): the named rules refuse first, a score fitted
on tuning data decides the rest, in integers, the same on every machine beyond a stated margin,
and it says why."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpucache import LearnedDecision
from gpucache.guard.features import NAMES, Reader, rounded
from gpucache.guard.learned import SCALE, WEIGHTS_FILE, Weights
from gpucache.guard.settings import GuardSettings


@pytest.fixture(scope="module")
def decision() -> LearnedDecision:
    return LearnedDecision()


# Rewordings of each kind the guard lets through: at a similarity a cache sees them at, served
PASS_THROUGH = [
    ("How do I reset my password?", "how do i resett my pasword"),  # misspellings
    ("hey, quick question, how can I reset my password? thanks!", "How do I reset my password?"),  # framing
    ("how do I turn off notifications", "how do I disable notifications"),  # the table's verbs
    ("what is the capital of France", "which city is the capital of France"),  # a word restating the ask
    ("summarize this article", "give me a summary of this article"),  # another construction
    (
        "how r u supposed to clean a cast iron pan",
        "how are you supposed to clean a cast iron pan",
    ),  # shorthand
]

# Near-misses a named rule refuses whatever the score
VETOED = [
    ("convert 10 miles to km", "convert 10 km to miles", "direction"),
    ("convert 10 miles to km", "convert 12 miles to km", "numbers"),
    ("how do I enable dark mode", "how do I disable dark mode", "antonym"),
    ("write a poem about the sea", "write a short poem about the sea", "tone"),
]


@pytest.mark.parametrize("stored, asked", PASS_THROUGH)
def test_a_rewording_of_each_kind_the_guard_passes_is_served(decision, stored, asked):
    for similarity in (0.88, 0.92):
        for a, b in ((stored, asked), (asked, stored)):
            verdict = decision.judge(a, b, similarity)
            assert not verdict.rejected and verdict.rule == "score", verdict


@pytest.mark.parametrize("stored, asked, rule", VETOED)
def test_a_named_difference_is_refused_before_the_score(decision, stored, asked, rule):
    verdict = decision.judge(stored, asked, 1.0)
    assert verdict.rejected and verdict.rule == rule
    assert decision.explain(asked, stored).rule == rule  # either way round, without a similarity


@pytest.mark.parametrize(
    "stored, asked, similarity, rule",
    [
        ("convert 10 miles to km", "convert 12 miles to km", 0.99, "numbers"),
        ("how do I enable dark mode", "how do I disable dark mode", 0.97, "antonym"),
    ],
)
def test_a_veto_removed_lets_the_score_serve_what_it_refused(stored, asked, similarity, rule):
    """The vetoes do the refusing: the score alone would serve these near-misses."""
    without = LearnedDecision()
    assert without.judge(stored, asked, similarity).rule == rule
    without.reader = Reader(skip=(rule,))
    verdict = without.judge(stored, asked, similarity)
    assert not verdict.rejected and verdict.rule == "score"


def test_a_substituted_word_is_weighed_not_refused_outright(decision):
    """ "boil" / "poach": refused at the similarities such an edit usually has, served only where
    the embedder finds the two all but identical. Pinned on both sides of the cut, each farther
    from it than the margin."""
    low = decision.judge("how to boil an egg", "how to poach an egg", 0.960)
    high = decision.judge("how to boil an egg", "how to poach an egg", 0.970)
    assert low.rejected and low.rule == "score" and "substitution" in low.words
    assert not high.rejected
    for similarity in (0.960, 0.970):
        values = decision.reader.read("how to boil an egg", "how to poach an egg", similarity).values
        assert abs(decision.weights.score(values) - decision.weights.cut) > decision.weights.margin


def test_weights_moved_past_the_margin_flip_a_pinned_verdict(decision):
    """The pinned verdicts above catch a change to the weights: the base moved by more than the
    margin serves the refused pair."""
    values = decision.reader.read("how to boil an egg", "how to poach an egg", 0.960).values
    gap = decision.weights.cut - decision.weights.score(values)
    assert 0 < gap
    moved = LearnedDecision(dataclasses.replace(decision.weights, base=decision.weights.base + gap + 1))
    assert not moved.judge("how to boil an egg", "how to poach an egg", 0.960).rejected


def test_no_verdict_farther_than_the_margin_from_the_cut_moves_with_the_similarity_drift(decision):
    """The only input that may differ between machines is the similarity's last bits, at most
    ``drift`` thousandths (measured when the weights were fitted: bf16 against fp32). Every pair
    whose score is farther than ``margin`` from the cut keeps its verdict under that drift."""
    weights = decision.weights
    pairs = [(a, b) for a, b in PASS_THROUGH] + [
        ("how to boil an egg", "how to poach an egg"),
        ("how do I cancel my subscription", "how can I cancel my membership"),
        ("best way to learn python", "how should I learn python"),
    ]
    checked = near = 0
    for a, b in pairs:
        for milli in range(875, 1001):
            values = decision.reader.read(a, b, milli / 1000).values
            score = weights.score(values)
            if abs(score - weights.cut) <= weights.margin:
                near += 1
                continue
            for moved in (milli - weights.drift, milli + weights.drift):
                drifted = decision.reader.read(a, b, moved / 1000).values
                assert (weights.score(drifted) > weights.cut) == (score > weights.cut), (a, b, milli)
            checked += 1
    assert checked > 1000 and near < checked // 50


def test_the_score_is_an_exact_integer_sum_in_millionths_of_a_logit(decision):
    values = decision.reader.read("best way to learn python", "how should I learn python", 0.9).values
    w = decision.weights
    expected = w.base + sum(x * (v - c) for x, v, c in zip(w.weights, values, w.centre))
    assert type(w.score(values)) is int and w.score(values) == expected
    assert rounded(0.9) == 900 and SCALE == 1_000_000


def test_a_refusal_names_the_score_and_its_largest_contributions(decision):
    verdict = decision.judge("how do I cancel my subscription", "how can I cancel my membership", 0.9)
    assert verdict.rejected and verdict.rule == "score"
    assert verdict.detail.startswith("score ") and "<= cut 1.45" in verdict.detail
    assert verdict.words[0] == "substitution" and set(verdict.words) <= set(NAMES)


def test_the_verdict_is_the_same_whichever_prompt_was_stored(decision):
    for a, b in PASS_THROUGH + [("how to boil an egg", "how to poach an egg")]:
        assert decision.judge(a, b, 0.93) == decision.judge(b, a, 0.93)


def test_the_shipped_weights_name_their_features_and_how_they_were_made():
    from importlib import resources

    doc = json.loads(resources.files("gpucache.guard").joinpath(WEIGHTS_FILE).read_text("utf-8"))
    assert doc["names"] == list(NAMES) and doc["command"].startswith("python3 bench/learn_decision.py")
    assert all("exam" not in name for name in doc["trained_on"])
    assert Weights.from_json(doc) == Weights.shipped()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"names": ["similarity"]}, "features are not"),
        ({"weights": [0.5] * len(NAMES)}, "integers"),
        ({"drift": -1}, "drift"),
    ],
)
def test_a_weights_file_of_another_shape_is_refused_by_name(change, message):
    from importlib import resources

    doc = json.loads(resources.files("gpucache.guard").joinpath(WEIGHTS_FILE).read_text("utf-8"))
    with pytest.raises(ValueError, match=message):
        Weights.from_json({**doc, **change})


def test_the_settings_choose_the_decision_and_refuse_soft_rules_beside_the_learned_one():
    assert isinstance(GuardSettings(decision="learned").build(), LearnedDecision)
    assert GuardSettings().build().name == "lexical-near-miss"
    with pytest.raises(ValueError, match="decision must be one of rules, learned"):
        GuardSettings(decision="neural")
    with pytest.raises(ValueError, match="the learned decision has none"):
        GuardSettings(("added",), "learned")


def test_the_settings_file_names_the_decision(tmp_path):
    from gpucache.cache.settings import read_settings_file

    path = tmp_path / "g.toml"
    path.write_text('[guard]\ndecision = "learned"\n', encoding="utf-8")
    assert read_settings_file(path)[1] == GuardSettings(decision="learned")
    path.write_text('[guard]\ndecide = "learned"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="unknown \\[guard\\] setting"):
        read_settings_file(path)
