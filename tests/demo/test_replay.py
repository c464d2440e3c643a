"""The main job (gpucache/demo/replay.py): a realistic workload replayed through a cache, from
the command line and as a function."""

from __future__ import annotations

import subprocess
import sys

import gpucache
from gpucache.demo.replay import StandInModel, load_workload, run_demo


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpucache", *args], capture_output=True, text=True, timeout=600
    )


def test_demo_replays_a_slice_and_prints_a_summary():
    result = run_cli("demo", "--limit", "40", "--seconds-per-word", "0")
    assert result.returncode == 0, result.stderr
    assert "prompts replayed      40" in result.stdout
    assert "hit rate" in result.stdout and "time saved" in result.stdout


def test_workload_mixes_every_kind_of_traffic():
    kinds = {item.kind for item in load_workload()}
    assert kinds == {"original", "repeat", "paraphrase", "near-miss", "unrelated"}
    assert len(load_workload()) >= 200


def test_run_demo_counts_add_up(real_embedder):
    cache = gpucache.SemanticCache(real_embedder, device="cpu")
    report = run_demo(cache, model=StandInModel(seconds_per_word=0), limit=60, batch_size=8)
    assert report.prompts == 60
    assert report.exact_hits + report.semantic_hits + report.misses == 60
    assert report.exact_hits > 0 and report.misses > 0


def test_the_demo_serves_no_wrong_answer(real_embedder):
    """The whole packaged workload through the default cache: hits, and not one of them a
    different question's answer. The same replay with similarity alone at a lower threshold
    does serve wrong answers, so the count can see them."""
    defaults = gpucache.SemanticCache(real_embedder, device="cpu")
    report = run_demo(defaults, model=StandInModel(seconds_per_word=0), batch_size=16)
    assert report.prompts == len(load_workload())
    assert report.semantic_hits > 0 and report.false_hits == 0, report.false_examples
    unguarded = gpucache.SemanticCache(
        real_embedder, device="cpu", threshold=0.8, verifier=gpucache.ThresholdOnly()
    )
    assert run_demo(unguarded, model=StandInModel(seconds_per_word=0)).false_hits > 0
