"""The command line: the main job and the info command run end to end."""

from __future__ import annotations

import subprocess
import sys

import gpucache
from gpucache.tools.demo import StandInModel, load_workload, run_demo


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpucache", *args], capture_output=True, text=True, timeout=600
    )


def test_info_reports_device_and_no_gpu_without_error():
    result = run_cli("info")
    assert result.returncode == 0, result.stderr
    assert "device" in result.stdout and "torch" in result.stdout
    # what the CPU scan multiplies with, and whether numpy's BLAS threads sleep when idle
    assert "fp32 cpu scan" in result.stdout and "sleeps when idle" in result.stdout
    assert "int8 cpu scan batches" in result.stdout and "one query" in result.stdout


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


def test_kernels_subpackage_is_installed_with_the_library():
    import gpucache.kernels

    assert gpucache.kernels.__name__ == "gpucache.kernels"
