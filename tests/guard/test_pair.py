"""The pair decision (gpucache/guard/pair.py): the named rules refuse first, either way round;
past them the pair model's rounded score decides against its cut, a pair within the margin of
the cut is a miss, and a pair too long for the model is judged by the full rules. A stand-in
model here (its scores chosen by the test); tests/pairing/ runs the shipped one."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpucache.guard.memo import reading_for
from gpucache.guard.pair import PairDecision
from gpucache.guard.settings import GuardSettings
from gpucache.pairing.meta import NEVER, Meta


@dataclass
class StandIn:
    """Scores every pair alike (``score``), counting what it was asked."""

    score: int | None
    # floor 0.8; a pair the soft rules refuse served past 1.00, one they accept refused below -1.00;
    # a margin of 0.20 logits either way
    meta: Meta = field(default_factory=lambda: Meta("test", 256, 800, 100, -100, 20, ""))
    asked: list[list[tuple[str, str]]] = field(default_factory=list)

    def scores(self, pairs):
        self.asked.append(list(pairs))
        return [self.score for _ in pairs]


@pytest.mark.parametrize(
    "stored, asked, rule",
    [
        ("how many grams of yeast for 2 loaves", "how many grams of yeast for 3 loaves", "numbers"),
        ("can I freeze cooked rice", "can I not freeze cooked rice", "negation"),
        ("how do I turn on the porch light timer", "how do I turn off the porch light timer", "antonym"),
        (
            "translate 'good night' from Welsh to Irish",
            "translate 'good night' from Irish to Welsh",
            "direction",
        ),
    ],
)
def test_a_named_rule_refuses_first_whatever_the_model_says(stored, asked, rule):
    decision = PairDecision(StandIn(score=900))
    for a, b in ((stored, asked), (asked, stored)):
        verdict = decision.judge(a, b, 0.95)
        assert verdict.rejected and verdict.rule == rule
    assert decision.model.asked == []  # the model was never asked


def test_requests_that_read_the_same_are_served_without_the_model():
    decision = PairDecision(StandIn(score=-900))
    verdict = decision.judge("hey, how long do I boil an egg? thanks", "How long do I boil an egg", 0.97)
    assert not verdict.rejected and verdict.rule == "identical"
    assert decision.model.asked == []


REFUSED = ("what oil keeps a wooden salad bowl from cracking", "which oil stops a wooden salad bowl cracking")
ACCEPTED = ("how often should I water a snake plant", "how often do I need to water a snake plant")


@pytest.mark.parametrize(
    "score, served",
    [(900, True), (121, True), (120, False), (110, False), (100, False), (-300, False)],
    ids=["far past", "just past the margin", "at cut + margin", "within the margin", "at the cut", "below"],
)
def test_a_pair_the_soft_rules_refuse_is_served_only_past_the_cut_by_more_than_the_margin(score, served):
    decision = PairDecision(StandIn(score=score))
    assert decision.soft(*REFUSED).rule == "substitution"
    verdict = decision.judge(*REFUSED, 0.9)
    assert verdict.rejected is not served and verdict.rule == "pair"
    assert "the rules refuse (substitution)" in verdict.detail and "cut 1.00" in verdict.detail


@pytest.mark.parametrize("score, served", [(-79, True), (-80, False), (-90, False), (-500, False)])
def test_a_pair_the_soft_rules_accept_is_refused_below_the_keeping_cut(score, served):
    decision = PairDecision(StandIn(score=score))
    assert not decision.soft(*ACCEPTED).rejected
    verdict = decision.judge(*ACCEPTED, 0.9)
    assert verdict.rejected is not served and verdict.rule == "pair"


def test_a_side_the_design_leaves_to_the_rules_never_asks_the_model():
    model = StandIn(score=900, meta=Meta("test", 256, 800, NEVER, -NEVER, 20, ""))
    decision = PairDecision(model)
    assert decision.judge(*REFUSED, 0.9).rule == "substitution"
    assert not decision.judge(*ACCEPTED, 0.9).rejected
    decision.prepare([REFUSED, ACCEPTED])
    assert model.asked == []


def test_below_the_floor_a_miss_whatever_the_score():
    decision = PairDecision(StandIn(score=900))
    assert decision.judge(*ACCEPTED, 0.7995).rule == "pair"  # rounds to 0.800: at the floor
    verdict = decision.judge(*ACCEPTED, 0.7994)
    assert verdict.rejected and verdict.rule == "floor"


def test_a_pair_too_long_for_the_model_is_judged_by_the_full_rules():
    decision = PairDecision(StandIn(score=None))
    reworded = decision.judge(*ACCEPTED, 0.9)
    assert not reworded.rejected and reworded.rule == "rules"
    assert decision.veto("best glue for a cracked mug", "best glue for a cracked ceramic mug").rule == "pass"
    shape = decision.judge("best glue for a cracked mug", "best glue for a cracked ceramic mug", 0.9)
    assert shape.rejected and shape.rule == "added"  # a soft rule decides where the model cannot read


def test_prepare_scores_a_batch_in_one_pass_and_judge_reuses_it():
    model = StandIn(score=500)
    decision = PairDecision(model)
    pairs = [
        ("what tiles suit a damp bathroom floor", "which tiles work for a wet bathroom floor"),
        ("what oil keeps a wooden salad bowl from cracking", "which oil stops a wooden salad bowl cracking"),
        (
            "how many grams of yeast for 2 loaves",
            "how many grams of yeast for 3 loaves",
        ),  # vetoed: not scored
    ]
    decision.prepare(pairs + pairs[:1])
    assert model.asked == [pairs[:2]]
    for a, b in pairs[:2]:
        assert not decision.judge(b, a, 0.9).rejected  # either way round
    assert len(model.asked) == 1
    with reading_for("another tenant"):  # a score kept for one reader is not another's
        decision.judge(*pairs[0], 0.9)
    assert len(model.asked) == 2


def test_the_settings_build_the_pair_decision_on_the_embedders_device():
    built = GuardSettings(decision="pair").build("cpu")
    assert isinstance(built, PairDecision) and repr(built) == "PairDecision(device='cpu')"
    with pytest.raises(ValueError, match="the pair decision has none"):
        GuardSettings(skip_rules=("added",), decision="pair")
