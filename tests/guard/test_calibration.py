"""``gpucache calibrate``: the operating point with the most hits whose false-hit rate stays
within a budget on its Clopper-Pearson upper bound, checked on synthetic pairs whose rates are
known; the settings file it writes, read by ``SemanticCache.from_config`` and by
``gpucache serve --config``; and the command on a small file, end to end."""

from __future__ import annotations

import json

import pytest

from gpucache import SemanticCache
from gpucache.cli import main
from gpucache.guard.calibration import (
    LEARNED,
    PAIR,
    THRESHOLDS_MILLI,
    Choice,
    Scored,
    best_point,
    binomial_cdf,
    choose,
    fold_of,
    interval,
    most_false_hits,
    near,
    similarity_milli,
    skip_sets,
    to_toml,
    upper_bound,
)
from gpucache.guard.settings import SOFT_RULES, GuardSettings
from gpucache.serve.sources import resolve


@pytest.mark.parametrize("k, n", [(0, 100), (3, 200), (24, 36), (10, 10), (0, 1)])
def test_the_bounds_are_where_the_binomial_tails_say(k, n):
    high = upper_bound(k, n)
    if k < n:
        assert binomial_cdf(k, n, high) == pytest.approx(0.05, abs=1e-9)
    low2, high2 = interval(k, n)
    if k < n:
        assert binomial_cdf(k, n, high2) == pytest.approx(0.025, abs=1e-9)
    if k > 0:
        assert 1 - binomial_cdf(k - 1, n, low2) == pytest.approx(0.025, abs=1e-9)
    assert low2 <= k / n <= high2
    assert upper_bound(0, n) == pytest.approx(1 - 0.05 ** (1 / n))


def pairs(negatives: int, positives: int, accepted=lambda label, milli, skip: True) -> list[Scored]:
    """Label-0 similarities spread evenly over 0.800-0.899, label-1 over 0.850-0.999; every
    other pair in the held-out half, so the two halves are alike."""
    out = []
    for i in range(negatives):
        milli = 800 + (i * 100) // negatives
        out.append(Scored(0, milli, {s: accepted(0, milli, s) for s in skip_sets()}, i % 2))
    for i in range(positives):
        milli = 850 + (i * 150) // positives
        out.append(Scored(1, milli, {s: accepted(1, milli, s) for s in skip_sets()}, i % 2))
    return out


def half(data: list[Scored], fold: int) -> list[Scored]:
    return [p for p in data if p.fold == fold]


def served(data: list[Scored], t: int, skip=()) -> tuple[int, int]:
    chosen = [p for p in data if p.similarity_milli >= t and p.accepted[skip]]
    return sum(p.label for p in chosen), sum(1 - p.label for p in chosen)


def test_the_choice_is_the_lowest_threshold_whose_bound_keeps_the_budget():
    data = pairs(4000, 1000)
    choice = choose(data, budget=0.02)
    assert isinstance(choice, Choice) and choice.skip_rules == ()  # skipping adds nothing here
    # its figures are the held-out half's, where it was not chosen
    assert (choice.hits, choice.false_hits) == served(half(data, 1), choice.threshold_milli)
    assert choice.false_hit_bound <= 0.02 and choice.chosen_on == len(half(data, 0))
    lower = [t for t in THRESHOLDS_MILLI if t < choice.threshold_milli]
    # on the half that chose it, one step lower breaks the budget
    assert upper_bound(served(half(data, 0), lower[-1])[1], 2000) > 0.02


def test_a_soft_rule_is_switched_off_only_where_it_buys_hits_within_the_budget():
    # "added" refuses a third of the label-1 pairs and no label-0 pair that the threshold admits
    def accepted(label, milli, skip):
        return "added" in skip or not (label == 1 and milli % 3 == 0)

    data = pairs(4000, 1000, accepted)
    choice = choose(data, budget=0.02)
    assert choice.skip_rules == ("added",)  # and no other rule: the others buy nothing
    assert choice.hits > served(half(data, 1), choice.threshold_milli, ())[0]  # it bought hits
    assert choice.false_hit_bound <= 0.02


def test_the_learned_decision_is_chosen_where_it_serves_more_within_the_budget(tmp_path):
    """Beside the skip sets, the learned decision is one more candidate where the pairs carry
    its verdicts; chosen, the settings file names it and switches no soft rule off."""
    from gpucache.cache.settings import read_settings_file

    def accepted(label, milli, skip):  # the rules refuse a third of the label-1 pairs whatever is skipped
        return not (label == 1 and milli % 3 == 0)

    data = pairs(4000, 1000, accepted)
    assert choose(data, budget=0.02).decision == "rules"  # not judged by it: never chosen
    with_learned = [Scored(p.label, p.similarity_milli, {**p.accepted, LEARNED: True}, p.fold) for p in data]
    choice = choose(with_learned, budget=0.02)
    assert choice.decision == "learned" and choice.skip_rules == LEARNED
    path = tmp_path / "gpucache.toml"
    path.write_text(to_toml(choice, "gpucache calibrate x"))
    assert read_settings_file(path)[1] == GuardSettings(decision="learned")


def test_the_pair_decision_is_chosen_where_it_serves_more_and_the_learned_one_first_in_a_tie(tmp_path):
    """The pair decision is a candidate too where the pairs carry its verdicts; chosen, the
    settings file names it; serving exactly what the learned decision serves, the learned one
    (the first of the two) stays the choice."""
    from gpucache.cache.settings import read_settings_file

    def accepted(label, milli, skip):  # the rules refuse a third of the label-1 pairs whatever is skipped
        return not (label == 1 and milli % 3 == 0)

    data = pairs(4000, 1000, accepted)
    with_pair = [Scored(p.label, p.similarity_milli, {**p.accepted, PAIR: True}, p.fold) for p in data]
    choice = choose(with_pair, budget=0.02)
    assert choice.decision == "pair" and choice.skip_rules == PAIR
    path = tmp_path / "gpucache.toml"
    path.write_text(to_toml(choice, "gpucache calibrate x"))
    assert read_settings_file(path)[1] == GuardSettings(decision="pair")
    both = [Scored(p.label, p.similarity_milli, {**p.accepted, LEARNED: True}, p.fold) for p in with_pair]
    assert choose(both, budget=0.02).decision == "learned"


@pytest.mark.parametrize("hair", [3e-8, 3e-7, 3e-6])
def test_one_pair_as_two_machines_compute_it_is_one_similarity(hair):
    # fp32 embeddings summed in another order differ in about the seventh place
    for milli in (800, 875, 905, 999):
        assert similarity_milli(milli / 1000 - hair) == similarity_milli(milli / 1000 + hair) == milli
    assert similarity_milli(0.87549) == 875  # a threshold is reached, never rounded up to
    assert similarity_milli(1.0000001) == 1000 and similarity_milli(-0.25) == -250


def test_the_same_pairs_choose_the_same_point_on_a_machine_whose_arithmetic_differs():
    def as_computed(offset: float) -> list[Scored]:
        # every similarity on a threshold of the grid or between, a hair off on each machine
        return [
            Scored(p.label, similarity_milli(p.similarity_milli / 1000 + offset), p.accepted, p.fold)
            for p in pairs(4000, 1000)
        ]

    here, there = choose(as_computed(-4e-7), budget=0.02), choose(as_computed(4e-7), budget=0.02)
    assert here is not None and here == there


def test_the_pairs_near_the_chosen_threshold_are_counted():
    assert near([0.8746, 0.8751, 0.87549, 0.8756, 0.90], 875) == 3


def test_too_few_different_pairs_to_promise_the_budget_is_no_choice():
    assert choose(pairs(50, 50), budget=0.01) is None  # 0 of 50 still bounds at 5.8%
    with pytest.raises(ValueError):
        choose(pairs(50, 50), budget=0)


def test_the_settings_file_is_read_by_the_library_and_by_the_server(tmp_path, fake_embedder):
    choice = Choice(905, ("added", "crossed"), 10, 20, 0, 400, 0.95)
    path = tmp_path / "gpucache.toml"
    path.write_text('upstream = "http://127.0.0.1:1/v1"\n' + to_toml(choice, "gpucache calibrate x"))
    cache = SemanticCache.from_config(path, fake_embedder, device="cpu")
    assert cache.threshold == 0.905 and cache.verifier.skip == {"added", "crossed"}
    served_settings = resolve(None, {}, str(path)).settings()
    assert served_settings.cache.threshold == 0.905
    assert served_settings.guard.skip_rules == ("added", "crossed")


def test_only_soft_rules_may_be_switched_off():
    with pytest.raises(
        ValueError, match=r"only soft rules may be skipped \(added, substitution, .*\), not \['numbers'\]"
    ):
        GuardSettings(("numbers",))
    for not_a_list in ("added", ("added", 3)):
        with pytest.raises(ValueError, match="skip_rules must be a list of rule names"):
            GuardSettings(not_a_list)  # type: ignore[arg-type]
    assert GuardSettings(("crossed", "added")).skip_rules == ("added", "crossed")  # one order


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_command_calibrates_a_file_end_to_end(tmp_path, capsys, monkeypatch):
    import torch

    from gpucache.embedding import embedder

    # a machine whose cache would serve in bf16: the command still embeds in fp32
    monkeypatch.setattr(embedder, "_default_dtype", lambda device: torch.bfloat16)
    same = [
        ("How do I boil an egg?", "how do you boil an egg"),
        ("What is the capital of Peru?", "capital of Peru?"),
        ("Tips for sleeping better", "How can I sleep better?"),
    ]
    different = [
        ("How do I boil an egg?", "How do I poach an egg?"),
        ("Capital of Peru", "Capital of Chile"),
        ("Convert 3 feet to meters", "Convert 3 meters to feet"),
        ("Is x > 2?", "Is x < 2?"),
    ]
    rows = [{"a": a, "b": b, "label": 1} for a, b in same] + [
        {"a": a, "b": b, "label": 0} for a, b in different
    ]
    pairs_file, out = tmp_path / "mine.jsonl", tmp_path / "gpucache.toml"
    write(pairs_file, rows)
    assert main(["calibrate", str(pairs_file), "--budget", "0.99", "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "7 pairs: 3 same request, 4 different" in printed and "expected false hits" in printed
    assert "similarities from float32 embeddings in float64, compared to 4 places" in printed
    assert "the point is chosen on" in printed and "[embedder]" not in out.read_text()
    assert "the luckiest of 1,360 candidates" in printed  # 32 skip sets, the learned and the pair decision
    assert "[cache]\nthreshold = " in out.read_text() and "[guard]\nskip_rules = [" in out.read_text()
    # a budget the file cannot promise: no settings, and why
    assert (
        main(
            [
                "calibrate",
                str(pairs_file),
                "--budget",
                "0.01",
                "--out",
                str(tmp_path / "x.toml"),
                "--device",
                "cpu",
            ]
        )
        == 1
    )
    assert "add label-0 pairs" in capsys.readouterr().err and not (tmp_path / "x.toml").exists()


@pytest.mark.parametrize(
    "line",
    [
        '{"a": "x", "b": "y"}',
        "not json",
        '{"a": "", "b": "y", "label": 1}',
        '{"a": "x", "b": "y", "label": 2}',
        '{"a": "x", "b": "y", "label": true}',
    ],
)
def test_a_broken_line_is_named_and_nothing_is_written(tmp_path, capsys, line):
    pairs_file = tmp_path / "bad.jsonl"
    pairs_file.write_text('{"a": "x", "b": "y", "label": 1}\n' + line + "\n")
    assert main(["calibrate", str(pairs_file), "--out", str(tmp_path / "g.toml")]) == 2
    assert f"{pairs_file}:2:" in capsys.readouterr().err and not (tmp_path / "g.toml").exists()


class Filters:
    """A pair's verdicts under every set of skipped rules: the guard accepts it unless a rule
    that is not skipped rejects it (each soft rule rejects it or not, independently)."""

    def __init__(self, rejects: frozenset[str]) -> None:
        self.rejects = rejects

    def __getitem__(self, skip: tuple[str, ...]) -> bool:
        return not any(rule in self.rejects for rule in SOFT_RULES if rule not in skip)

    def __contains__(self, skip: object) -> bool:  # the simulation judges the skip sets alone
        return isinstance(skip, tuple) and set(skip) <= set(SOFT_RULES)


REJECTS = 0.4  # each soft rule rejects a pair (either label) with this probability


def simulated(rng, negatives: int, positives: int) -> list[Scored]:
    """Pairs drawn from a population whose rates are known: a label-0 pair's similarity is
    uniform over 0.800-0.999, a label-1 pair's over 0.850-0.999, and each soft rule rejects
    a pair with probability ``REJECTS``; so the true false-hit rate of (t, skip) is
    (1000 - t) / 200 * (1 - REJECTS) ** (rules not skipped)."""
    out = []
    for label, n, low in ((0, negatives, 800), (1, positives, 850)):
        for _ in range(n):
            milli = low + int(rng.random() * (1000 - low))
            rejects = frozenset(rule for rule in SOFT_RULES if rng.random() < REJECTS)
            out.append(Scored(label, milli, Filters(rejects), int(rng.random() < 0.5)))  # type: ignore[arg-type]
    return out


def true_false_hit_rate(threshold_milli: int, skip: tuple[str, ...]) -> float:
    return (1000 - threshold_milli) / 200 * (1 - REJECTS) ** (len(SOFT_RULES) - len(skip))


def test_the_chosen_point_is_over_budget_in_at_most_the_promised_share_of_draws():
    """The promise of a 95% bound: across many draws of pairs, the chosen point's true rate is
    over the budget in at most 5% of them. Choosing among the 1,280 candidates and bounding on
    the same pairs breaks it (``best_point`` alone, as calibrate did: over budget in about one
    draw in seven here); confirming on the held-out half keeps it."""
    import random

    rng = random.Random(7)
    draws, budget = 150, 0.05
    over = {"held out": 0, "same pairs": 0}
    chosen = 0
    for _ in range(draws):
        data = simulated(rng, 300, 300)
        choice = choose(data, budget)
        if choice is not None:
            chosen += 1
            over["held out"] += true_false_hit_rate(choice.threshold_milli, choice.skip_rules) > budget
        same = best_point(data, budget)
        over["same pairs"] += same is not None and true_false_hit_rate(*same) > budget
    assert over["same pairs"] > 0.05 * draws  # the simulation finds the flaw where it is
    assert over["held out"] <= 0.05 * draws, over
    assert chosen >= 0.15 * draws  # and the held-out choice is not "never choose"


def test_the_settings_file_records_the_model_the_threshold_was_chosen_with(tmp_path):
    from gpucache.cache.settings import read_settings_file

    choice = Choice(905, (), 10, 20, 0, 400, 0.95, chosen_on=420)
    path = tmp_path / "gpucache.toml"
    path.write_text(
        'upstream = "http://127.0.0.1:1/v1"\n'
        + to_toml(choice, "gpucache calibrate x --model /models/mine", model="/models/mine")
    )
    assert read_settings_file(path)[2] == "/models/mine"
    assert resolve(None, {}, str(path)).settings().embedder.model == "/models/mine"  # the server's too
    assert "chosen on 420 pairs; on the 420 held out" in path.read_text()


# The statistics' edges, each as the rule states it (the mutation run found them unwritten).


def test_a_rate_of_nothing_seen_is_anywhere_and_all_of_n_reaches_one():
    assert interval(0, 0) == (0.0, 1.0) and upper_bound(0, 0) == 1.0
    low, high = interval(10, 10)
    assert high == 1.0 and 0.0 < low < 1.0
    assert interval(0, 10)[0] == 0.0


def test_the_most_false_hits_a_budget_allows_is_the_largest_count_whose_bound_keeps_it():
    for negatives in (7, 100):  # every count's bound, read whole
        for budget in (0.01, 0.03, 0.05, 0.2, 0.5):
            allowed = [k for k in range(negatives + 1) if upper_bound(k, negatives) <= budget]
            assert most_false_hits(negatives, budget) == (max(allowed) if allowed else -1)
    bounds = [upper_bound(k, 100) for k in range(101)]
    assert bounds == sorted(bounds)  # the bound grows with the count, so for 1,000 pairs the
    for budget in (0.01, 0.03, 0.05, 0.2, 0.5):  # count and the next one decide (bounds of all
        most = most_false_hits(1000, budget)  # 1,001 counts took two minutes)
        assert most >= 0 and upper_bound(most, 1000) <= budget < upper_bound(most + 1, 1000)
    # none served bounds at 2.95% of 100 and one at 4.66%: a budget between allows none, not one
    assert most_false_hits(100, 0.04) == 0
    assert most_false_hits(50, 0.01) == -1  # not even none: 0 of 50 bounds at 5.8%
    assert most_false_hits(100, upper_bound(0, 100)) == 0  # a bound equal to the budget keeps it
    # the confidence is the caller's: at 50%, none served of 100 bounds at 0.69%
    assert most_false_hits(100, 0.01, confidence=0.5) == 0 and most_false_hits(100, 0.01) == -1


def test_a_count_whose_bound_equals_the_budget_is_allowed_at_the_callers_confidence():
    # the bisection's own comparisons, past the first count: "within" the budget includes it
    assert most_false_hits(1000, upper_bound(3, 1000)) == 3
    # 99% confidence allows fewer than 95% does at every count the bisection tries
    assert most_false_hits(1000, 0.01, confidence=0.99) == 2 and most_false_hits(1000, 0.01) == 4


def test_a_binomial_probability_at_the_edges_of_p_and_k_is_what_the_distribution_says():
    # p = 0: nothing ever happens, so at most k happen for every k >= 0
    assert binomial_cdf(0, 5, 0.0) == binomial_cdf(2, 5, 0.0) == 1.0
    # p = 1: everything happens, so fewer than n is impossible and all n is certain
    assert binomial_cdf(0, 5, 1.0) == binomial_cdf(3, 5, 1.0) == 0.0 and binomial_cdf(5, 5, 1.0) == 1.0
    assert binomial_cdf(-1, 5, 0.3) == 0.0  # fewer than none never happens
    # at most n of n is certain, exactly: summed, the terms come to 0.9999999999999999 here
    assert binomial_cdf(2, 2, 7 / 97) == 1.0 and binomial_cdf(5, 5, 0.3) == 1.0
    # a probability is never above one: summed, these terms come to 1.0000000000000002
    assert binomial_cdf(9, 10, 1 / 97) == 1.0


def test_the_budget_is_a_rate_strictly_between_none_and_all():
    for budget in (0, 1, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"budget must be in \(0, 1\)"):
            choose(pairs(50, 50), budget=budget)


def held_out_edge(negatives_each: int) -> list[Scored]:
    """Label-0 pairs that no threshold serves and label-1 pairs at 0.990, the same in both halves."""
    out = []
    for fold in (0, 1):
        out += [Scored(0, 700, {s: True for s in skip_sets()}, fold) for _ in range(negatives_each)]
        out += [Scored(1, 990, {s: True for s in skip_sets()}, fold) for _ in range(10)]
    return out


def test_a_choice_whose_held_out_bound_equals_the_budget_is_kept_and_counts_each_label():
    data = held_out_edge(300)
    choice = choose(data, budget=upper_bound(0, 300))
    assert choice is not None and choice.false_hit_bound == upper_bound(0, 300)
    assert (choice.threshold_milli, choice.hits, choice.positives, choice.negatives) == (990, 10, 10, 300)


def test_the_choice_is_made_at_the_callers_confidence():
    data = held_out_edge(100)  # none served of 100 bounds at 2.95% at 95%, at 0.69% at 50%
    assert choose(data, budget=0.01) is None
    choice = choose(data, budget=0.01, confidence=0.5)
    assert choice is not None and choice.confidence == 0.5


def test_every_set_of_soft_rules_may_be_switched_off():
    sets = skip_sets()
    assert len(sets) == 2 ** len(SOFT_RULES) == len(set(sets))
    assert sets[0] == () and sets[-1] == tuple(SOFT_RULES)


def test_a_similarity_above_one_counts_as_one():
    assert similarity_milli(1.002) == similarity_milli(1.5) == 1000


def test_the_split_is_the_same_on_every_machine_and_takes_any_text():
    # SHA-256 of the text: these folds are what every machine, every run, computes
    folds = [
        fold_of(a, b)
        for a, b in (
            ("a", "b"),
            ("ab", ""),
            ("How do I boil an egg?", "how do you boil an egg"),
            ("x", "y"),
            ("capital of Peru", "capital of Chile"),
            ("1", "2"),
        )
    ]
    assert folds == [0, 1, 1, 1, 0, 0]
    assert fold_of("\ud800 lone", "surrogate \udfff") in (0, 1)  # a lone surrogate is text too


def test_among_points_that_serve_as_many_the_highest_threshold_and_fewest_rules_skipped_come_first():
    """Ties are broken the same way on every run: more hits, then a higher threshold, then
    fewer rules skipped, then the first set of rules in ``skip_sets()``'s order; where no point
    keeps the false hits within the budget, there is none."""
    sets = skip_sets()
    singles = [s for s in sets if len(s) == 1]
    served_by_any_one = [Scored(1, 900, {s: len(s) >= 1 for s in sets}) for _ in range(10)]
    far_below = [Scored(0, 500, {s: True for s in sets}) for _ in range(60)]  # a budget of no false hit
    assert best_point(served_by_any_one + far_below, 0.05) == (900, singles[0])
    at_the_top = [Scored(0, 1000, {s: True for s in sets})] + far_below[1:]  # served at every threshold
    assert best_point(served_by_any_one + at_the_top, 0.05) is None
