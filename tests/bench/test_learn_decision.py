"""The learned-decision study (bench/learn_decision.py): its regression recovers a model it is
shown, and its reading of a pair leaves the named rules as vetoes, the soft shape rules as
features, and gives the same values whichever prompt was stored first."""

from __future__ import annotations

import numpy as np
from learn_decision import fit

from gpucache.guard.features import NAMES, SOFT_RULES, Reader, rounded


def test_the_regression_recovers_the_model_that_drew_the_labels():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4000, 2)) * [1.0, 10.0] + [0.0, 5.0]
    truth = np.array([2.0, -0.3]), 1.0
    p = 1 / (1 + np.exp(-(x @ truth[0] + truth[1])))
    y = (rng.random(4000) < p).astype(float)
    beta = fit(x, y, np.ones(4000), l2=0.0)
    assert np.allclose(beta[:2], truth[0], atol=0.15) and abs(beta[2] - truth[1]) < 0.3


def test_a_named_difference_is_a_veto_and_is_not_scored():
    reading = Reader().read("convert 10 miles to km", "convert 12 miles to km", 0.97)
    assert reading.veto is not None and reading.veto.rule == "numbers" and reading.values == ()


def test_a_soft_shape_is_a_feature_not_a_refusal():
    reading = Reader().read("reset my password", "reset my username", 0.9)
    assert reading.veto is None and "substitution" in reading.soft
    values = dict(zip(NAMES, reading.values))
    assert values["substitution"] == 1 and values["similarity"] == 900
    assert set(SOFT_RULES) <= set(NAMES)


def test_the_reading_is_the_same_both_ways_round():
    reader = Reader()
    for a, b in [
        ("how do I turn off notifications", "how do I disable notifications please"),
        ("When do you close?", "what are your closing times"),
    ]:
        assert reader.read(a, b, 0.85) == reader.read(b, a, 0.85)


def test_the_similarity_is_read_in_thousandths_half_up_and_clamped():
    assert [rounded(s) for s in (0.8764999, 0.8765, 1.2, -3.0)] == [876, 877, 1000, -1000]
