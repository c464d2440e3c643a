"""The false-hit benchmark (bench/false_hits.py, bench/labelled_pairs.py): its arithmetic, on
small files written here."""

from __future__ import annotations

import json

import pytest
from false_hits import render_report
from labelled_pairs import PairResult, ablation_variants, evaluate_pairs, replay_intents, word_jaccard

from gpucache import LexicalNearMissVerifier, ThresholdOnly


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


PAIRS = [
    {"a": "Convert 10 miles to km", "b": "Convert 10 km to miles", "label": 0},
    {"a": "How do I reset my password?", "b": "How can I reset my password?", "label": 1},
    {"a": "What is the capital of France?", "b": "Tell me the capital of France, please", "label": 1},
    {"a": "Why is the sky blue?", "b": "Recommend a sci-fi novel", "label": 0},
]


def test_pairs_rates_through_the_real_model(tmp_path, real_embedder):
    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    result = evaluate_pairs(path, real_embedder, LexicalNearMissVerifier())
    assert (result.pairs, result.label0, result.label1, result.near_misses) == (4, 2, 2, 1)
    plain, guarded = result.rates(0.85, guarded=False), result.rates(0.85, guarded=True)
    # similarity alone serves the miles/km near-miss; the verifier refuses it
    assert plain.false_hit == 0.5 and plain.near_miss_false_hit == 1.0
    assert guarded.false_hit == 0.0 and guarded.near_miss_false_hit == 0.0
    assert guarded.hit == plain.hit == 1.0
    assert result.rejected_by_rule == {"direction": 1}
    assert result.rule_yield(0.85) == {"direction": (1, 0)}  # one false hit stopped, no hit lost
    assert result.rule_yield(1.0) == {}  # above every pair's similarity nothing was at stake
    threshold, fh = result.threshold_only_at_hit_rate(1.0)
    assert threshold <= min(s for s, lab in zip(result.similarity, result.labels) if lab == 1)
    assert fh == 0.5
    text = render_report([result], [], threshold=0.85, top_k=1, command="cmd", about="about", plot=None)
    assert "| pairs | 4 |" in text and "50.0% / 100.0%" in text
    assert "| set | direction | threshold raised to the same hit rate |" in text
    # the ablation: every variant answered every pair; without "direction" the next rule in
    # line ("swapped") still refuses the near-miss, so the rates stay those of the default
    assert set(result.ablation) == set(ablation_variants())
    assert all(len(answers) == 4 for answers in result.ablation.values())
    assert result.ablation["without direction"] == result.accepted
    assert "## Each rule switched off (threshold 0.85)" in text
    assert "| all rules (the default) | 0.0% / 100.0%, " in text
    assert "| without direction | 0.0% / 100.0%, " in text and "| seed rules only |" in text


def test_rule_and_threshold_yields_count_by_label():
    result = PairResult(
        name="t",
        pairs=5,
        label0=3,
        label1=2,
        near_misses=0,
        similarity=[0.95, 0.91, 0.88, 0.86, 0.70],
        labels=[0, 1, 0, 1, 0],
        accepted=[False, False, True, True, True],
        near_miss=[False] * 5,
        rule=["numbers", "substitution", "", "", ""],
    )
    assert result.rule_yield(0.9) == {"numbers": (1, 0), "substitution": (0, 1)}
    assert result.rule_yield(0.96) == {}
    # raising the threshold from 0.85 to 0.9 stops the pairs at 0.88 (label 0) and 0.86 (label 1)
    assert result.threshold_yield(0.85, 0.9) == (1, 1)
    assert result.threshold_yield(0.9, 0.9) == (0, 0)


def test_dominance_compares_with_a_threshold_at_the_same_hit_rate():
    result = PairResult(
        name="t",
        pairs=6,
        label0=3,
        label1=3,
        near_misses=0,
        similarity=[0.99, 0.97, 0.95, 0.93, 0.91, 0.90],
        labels=[1, 0, 1, 0, 0, 1],
        accepted=[True, False, True, True, False, False],
        near_miss=[False] * 6,
    )
    # at 0.9 the verifier serves two of three label-1 pairs (0.99, 0.95) and one label-0 (0.93);
    # a threshold serving the same two label-1 pairs sits at 0.95 and serves one label-0 (0.97)
    assert result.rates(0.9, True).hit == pytest.approx(2 / 3)
    assert result.dominance(0.9) == pytest.approx(1.0)
    # a variant that also refuses the 0.93 pair serves no false hit at all
    assert result.dominance(0.9, [True, False, True, False, False, False]) == float("inf")
    # one that serves everything is threshold-only: a higher threshold has fewer false hits
    everything = [True] * 6
    assert result.rates(0.9, True, everything) == result.rates(0.9, False)
    assert result.dominance(0.9, everything) == pytest.approx(1.0)


def test_replay_counts_answers_from_another_intent(tmp_path, fake_embedder):
    rows = [
        {"text": t, "label": lab}
        for t, lab in [
            ("card arrival when", "card"),
            ("card arrival when please", "card"),
            ("lost card", "lost"),
            ("lost card please", "lost"),
        ]
    ]
    path = write_jsonl(tmp_path / "intents.jsonl", rows)
    [plain, guarded] = replay_intents(
        path, fake_embedder, ThresholdOnly(), [(0.5, 1, False), (0.99, 1, True)]
    )
    assert plain.asked == 2 and plain.served == 2 and plain.wrong == 0
    assert guarded.served == 0 and guarded.hit_rate == 0.0


def test_a_malformed_file_is_a_clear_error(tmp_path, fake_embedder):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": "x", "b": "y", "label": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        evaluate_pairs(bad, fake_embedder, ThresholdOnly())
    write_jsonl(bad, [{"a": "x", "label": 1}])
    with pytest.raises(ValueError, match="needs str 'a'"):
        evaluate_pairs(bad, fake_embedder, ThresholdOnly())


def test_word_jaccard():
    assert word_jaccard("a b c d e", "a b c d f") == pytest.approx(4 / 6)
    assert word_jaccard("", "") == 1.0


def test_the_split_is_keyed_balanced_and_the_same_in_every_process():
    from conftest import outputs_under_hash_seeds
    from labelled_pairs import half_of

    ids = [f"set:{n}" for n in range(2000)]
    halves = [half_of(i) for i in ids]
    assert set(halves) == {"tune", "report"}
    assert 900 <= halves.count("report") <= 1100
    assert [half_of(i) for i in ids] == halves  # a row stays in its half
    code = "from labelled_pairs import half_of\nprint(''.join(half_of(f'set:{n}')[0] for n in range(200)))"
    assert len(outputs_under_hash_seeds(code)) == 1


def test_the_halves_partition_a_file(tmp_path):
    from labelled_pairs import select_half

    rows = [{"a": f"q{n}", "b": f"r{n}", "label": n % 2, "id": f"t:{n}"} for n in range(50)]
    rows.append({"a": "no id", "b": "here", "label": 1})  # named by its file and line
    tune = select_half(rows, "tune", tmp_path / "t.jsonl")
    report = select_half(rows, "report", tmp_path / "t.jsonl")
    assert len(tune) + len(report) == len(rows) and tune and report
    assert not {id(r) for r in tune} & {id(r) for r in report}
    assert select_half(rows, "all", "t.jsonl") == rows
    with pytest.raises(ValueError, match="half must be one of"):
        select_half(rows, "test", "t.jsonl")


def test_a_half_is_measured_alone_and_an_empty_half_is_an_error(tmp_path, fake_embedder):
    from labelled_pairs import half_of

    rows = [dict(p, id=f"p:{n}") for n, p in enumerate(PAIRS)]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    report = [r for r in rows if half_of(r["id"]) == "report"]
    result = evaluate_pairs(path, fake_embedder, ThresholdOnly(), half="report")
    assert result.pairs == len(report)
    empty = [r for r in rows if half_of(r["id"]) == "tune"][:1]
    write_jsonl(path, empty)
    with pytest.raises(ValueError, match="no pairs in the 'report' half"):
        evaluate_pairs(path, fake_embedder, ThresholdOnly(), half="report")


def test_the_report_breaks_a_file_down_by_kind():
    result = PairResult(
        name="llm",
        pairs=4,
        label0=2,
        label1=2,
        near_misses=0,
        similarity=[0.95, 0.91, 0.97, 0.80],
        labels=[0, 0, 1, 1],
        accepted=[False, True, True, True],
        near_miss=[False] * 4,
        rule=["added", "", "", ""],
        kinds=["audience", "audience", "fillers", "fillers"],
    )
    text = render_report(
        [result], [], threshold=0.9, top_k=1, command="cmd", about="about", plot=None, half="report"
    )
    assert "## llm: by kind of pair (threshold 0.9)" in text
    assert "| audience | 0 | 2 | 2 | 1 | added 1 |" in text
    assert "| fillers | 1 | 2 | 1 | 1 | - |" in text
    assert "**report half**" in text
