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
    THRESHOLDS_MILLI,
    Choice,
    Scored,
    binomial_cdf,
    choose,
    interval,
    skip_sets,
    to_toml,
    upper_bound,
)
from gpucache.guard.settings import GuardSettings
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
    """Label-0 similarities spread evenly over 0.800-0.899, label-1 over 0.850-0.999."""
    out = []
    for i in range(negatives):
        milli = 800 + (i * 100) // negatives
        out.append(Scored(0, milli, {s: accepted(0, milli, s) for s in skip_sets()}))
    for i in range(positives):
        milli = 850 + (i * 150) // positives
        out.append(Scored(1, milli, {s: accepted(1, milli, s) for s in skip_sets()}))
    return out


def served(data: list[Scored], t: int, skip=()) -> tuple[int, int]:
    chosen = [p for p in data if p.similarity_milli >= t and p.accepted[skip]]
    return sum(p.label for p in chosen), sum(1 - p.label for p in chosen)


def test_the_choice_is_the_lowest_threshold_whose_bound_keeps_the_budget():
    data = pairs(2000, 1000)
    choice = choose(data, budget=0.02)
    assert isinstance(choice, Choice) and choice.skip_rules == ()  # skipping adds nothing here
    hits, false_hits = served(data, choice.threshold_milli)
    assert (choice.hits, choice.false_hits) == (hits, false_hits)
    assert choice.false_hit_bound <= 0.02
    lower = [t for t in THRESHOLDS_MILLI if t < choice.threshold_milli]
    assert upper_bound(served(data, lower[-1])[1], 2000) > 0.02  # one step lower breaks it


def test_a_soft_rule_is_switched_off_only_where_it_buys_hits_within_the_budget():
    # "added" refuses a third of the label-1 pairs and no label-0 pair that the threshold admits
    def accepted(label, milli, skip):
        return "added" in skip or not (label == 1 and milli % 3 == 0)

    data = pairs(2000, 1000, accepted)
    choice = choose(data, budget=0.02)
    assert choice.skip_rules == ("added",)  # and no other rule: the others buy nothing
    assert choice.hits > served(data, choice.threshold_milli, ())[0]  # it bought hits
    assert choice.false_hit_bound <= 0.02


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
    with pytest.raises(ValueError, match="soft rules"):
        GuardSettings(("numbers",))
    assert GuardSettings(("crossed", "added")).skip_rules == ("added", "crossed")  # one order


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_command_calibrates_a_file_end_to_end(tmp_path, capsys):
    same = [("How do I boil an egg?", "how do you boil an egg"), ("What is the capital of Peru?",
            "capital of Peru?"), ("Tips for sleeping better", "How can I sleep better?")]
    different = [("How do I boil an egg?", "How do I poach an egg?"), ("Capital of Peru", "Capital of Chile"),
                 ("Convert 3 feet to meters", "Convert 3 meters to feet"), ("Is x > 2?", "Is x < 2?")]
    rows = [{"a": a, "b": b, "label": 1} for a, b in same] + [{"a": a, "b": b, "label": 0} for a, b in different]
    pairs_file, out = tmp_path / "mine.jsonl", tmp_path / "gpucache.toml"
    write(pairs_file, rows)
    assert main(["calibrate", str(pairs_file), "--budget", "0.6", "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "7 pairs: 3 same request, 4 different" in printed and "expected false hits" in printed
    assert "[cache]\nthreshold = " in out.read_text() and "[guard]\nskip_rules = [" in out.read_text()
    # a budget the file cannot promise: no settings, and why
    assert main(["calibrate", str(pairs_file), "--budget", "0.01", "--out", str(tmp_path / "x.toml"),
                 "--device", "cpu"]) == 1
    assert "add label-0 pairs" in capsys.readouterr().err and not (tmp_path / "x.toml").exists()


@pytest.mark.parametrize("line", ['{"a": "x", "b": "y"}', "not json", '{"a": "", "b": "y", "label": 1}',
                                  '{"a": "x", "b": "y", "label": 2}', '{"a": "x", "b": "y", "label": true}'])
def test_a_broken_line_is_named_and_nothing_is_written(tmp_path, capsys, line):
    pairs_file = tmp_path / "bad.jsonl"
    pairs_file.write_text('{"a": "x", "b": "y", "label": 1}\n' + line + "\n")
    assert main(["calibrate", str(pairs_file), "--out", str(tmp_path / "g.toml")]) == 2
    assert f"{pairs_file}:2:" in capsys.readouterr().err and not (tmp_path / "g.toml").exists()
