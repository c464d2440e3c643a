"""The speed benchmark (bench/speed.py): its --quick mode runs end to end and reports what it
measured; its timing harness and report read right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

SPEED = Path(__file__).resolve().parents[2] / "bench" / "speed.py"


def test_bench_quick_writes_a_report(tmp_path, real_embedder):
    out = tmp_path / "bench.md"
    result = subprocess.run(
        [sys.executable, str(SPEED), "--quick", "--device", "cpu", "--repeat", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    assert "## cpu" in text and "read bandwidth" in text and "get_or_put_all end to end" in text
    assert "| vs FAISS flat |" in text and "Engines timed together" in text
    data = json.loads(out.with_suffix(".json").read_text())
    scans = data[0]["scans"]
    modes = {s["mode"] for s in scans if s["engine"] == "gpucache"}
    assert modes == {"fp32", "fp16", "bf16", "int8"}
    assert all(s["queries_per_s"] > 0 for s in scans)
    assert all((s["read_gb_per_s"] is not None) == (s["q"] == 1) for s in scans)
    assert all(s["read_gb_per_s"] > 0 for s in scans if s["q"] == 1)
    assert all(
        s["recall_at_k"] >= 0.99 for s in scans if s["engine"] == "gpucache" and s["recall_at_k"] is not None
    )
    overheads = data[0]["end_to_end"]["overhead"]
    assert [o["quantization"] for o in overheads] == ["fp32", "bf16", "int8"]
    for o in overheads:  # the call's own embedding and a scan are parts of the call
        assert 0 < o["embed_s"] <= o["get_or_put_all_s"] and o["scan_s"] < o["get_or_put_all_s"]
        assert f"{o['overhead_fraction']:.1%} of the embedding time" in text  # as measured
    assert text.count("Cache overhead at N = ") == 3
    # the verifier ran in the overhead's lookups: entries were stored near every prompt
    assert all(o["verifier_rejections_per_batch"] > 0 for o in overheads)
    # recall is against a float64 brute force, so every engine has one, FAISS's too
    assert all(s["recall_at_k"] is not None for s in scans)
    assert "| vs FAISS same precision |" in text and "FAISS's OpenMP pool set to" in text
    latency = data[0]["latency"]
    assert set(latency["ms"]) >= {"get (miss)", "get_or_put (semantic hit)", "get_or_put (miss)"}
    outcomes, count = latency["outcomes"], latency["count"]
    for name in ("get (miss)", "get_or_put (miss)"):  # a row named for misses timed misses only
        assert outcomes[name] == {"miss": count, "exact": 0, "semantic": 0}
    semantic = outcomes["get_or_put (semantic hit)"]  # counted for its own row, and reported
    assert sum(semantic.values()) == count and semantic["semantic"] > 0 and semantic["exact"] == 0
    assert f"| {semantic['semantic']} semantic" in text
    # every row's figures are the measured ones, printed as measured (p50 <= p99 holds by
    # definition, so it is not what is checked)
    for name, ms in latency["ms"].items():
        assert ms["p50"] > 0 and f"| {name} | {ms['p50']:.2f} | {ms['p99']:.2f} |" in text, name
    assert "### One lookup at a time" in text
    from gpucache.index.paths import resolve_quantization

    assert latency["quantization"] == resolve_quantization("auto", torch.device("cpu"), 384)
    if latency["quantization"] != "fp32":  # the default's storage beside a full-precision one
        assert "get (miss), fp32 store" in latency["ms"]
    # the report says which path the embedder took, as the embedder itself says
    assert latency["embedder"] == {
        "lean": real_embedder.uses_lean,
        "packed": real_embedder.packed,
        "single_text_path": real_embedder.single_text_path,
    }


def test_engines_are_timed_in_blocks_forward_then_reverse(monkeypatch):
    import speed_timing as bench
    import torch

    monkeypatch.setattr(bench, "BLOCK_SECONDS", 0.0)  # exactly the runs asked for
    log: list[str] = []
    now = [0.0]
    # seconds each call of each engine takes on a scripted clock, settling runs (100) included
    durations = {"a": [100, 1, 5, 100, 3], "b": [100, 2, 2, 100, 8], "c": [100, 4, 6, 100, 5]}

    def engine(name):
        def run():
            now[0] += durations[name][log.count(name)]
            log.append(name)

        return run

    timings = bench.timed_together(
        [engine(n) for n in "abc"], torch.device("cpu"), repeat=3, clock=lambda: now[0]
    )
    # each block: one settling run, then its timed runs; 2 timed runs forward, 1 in reverse
    assert "".join(log) == "aaabbbccc" + "ccbbaa"
    # the settling runs are left out: median and spread of the three timed runs
    assert timings == [(3, 4), (2, 6), (5, 2)]


def test_fast_engines_run_until_the_block_has_taken_long_enough(monkeypatch):
    import speed_timing as bench
    import torch

    monkeypatch.setattr(bench, "BLOCK_RUNS", 7)
    monkeypatch.setattr(bench, "BLOCK_SECONDS", 10.0)  # never reached: capped by BLOCK_RUNS
    log: list[int] = []
    bench.timed_together([lambda: log.append(1)], torch.device("cpu"), repeat=2)
    assert len(log) == (1 + 7) * 2  # a settling run and 7 timed runs per block, two blocks


def test_the_report_compares_each_mode_with_faiss_and_the_gpu_with_the_cpu():
    from speed import BenchReport, ScanResult, render

    versions = {
        "commit": "x",
        "python": "3",
        "torch": "2",
        "cuda": "12",
        "transformers": "5",
        "faiss": "1",
        "machine": "x86_64",
        "cpu_threads": "2",
    }

    def report(device, ours_qps, faiss_qps):
        scans = [
            ScanResult(device, "gpucache", "int8", 1000, 1, 1 / ours_qps, 0.0, ours_qps, 1.0),
            ScanResult("cpu", "faiss", "fp32", 1000, 1, 1 / faiss_qps, 0.0, faiss_qps, 1.0),
            ScanResult("cpu", "faiss", "int8", 1000, 1, 0.5 / faiss_qps, 0.0, 2 * faiss_qps, 1.0),
        ]
        return BenchReport(
            device,
            versions,
            10.0,
            {"fp32": 0.1},
            scans=scans,
            embed={"prompts": 4, "gpucache_prompts_per_s": ours_qps, "dtype": "x"},
            end_to_end={"prompts": 4, "seconds": 1.0, "prompts_per_s": ours_qps, "hit_rate": 0.5},
        )

    text = render([report("cpu", 50.0, 100.0), report("cuda:0", 400.0, 100.0)], "cmd")
    assert "| gpucache | int8 | 1000 | 1 |" in text and "| 0.50x |" in text and "| 4.00x |" in text
    assert "| 0.50x | 0.25x |" in text and "| 4.00x | 2.00x |" in text  # against FAISS's int8
    assert "Below FAISS IndexFlatIP: gpucache int8 N=1000 Q=1 (0.500x)." in text
    assert "Below FAISS IndexFlatIP: none." in text  # the GPU section
    assert "| scan queries/s, int8, N = 1000, Q = 1, cuda:0 / cpu | 8.0x |" in text
    assert "| embed prompts/s, cuda:0 / cpu | 8.0x |" in text


def test_int8_compute_is_a_fraction_of_the_int8_matmul_rate():
    """The roofline of an int8 batch is the machine's int8 matmul where the store multiplies
    in int8 (a CPU with torch._int_mm), and fp32 where it widens the rows."""
    import torch
    from speed import BenchReport, ScanResult, render
    from speed_timing import machine_limits, matmul_rate

    from gpucache.index.probes import CpuPaths

    assert matmul_rate(torch.device("cpu"), torch.int8, 1, 64) > 0
    _, rates = machine_limits(torch.device("cpu"), 1, quick=True)
    assert ("int8" in rates) == CpuPaths.detect().int8_matmul and {"fp32", "bf16", "fp16"} <= set(rates)
    versions = {
        "commit": "x",
        "python": "3",
        "torch": "2",
        "cuda": "-",
        "transformers": "5",
        "faiss": "1",
        "machine": "x86_64",
        "cpu_threads": "2",
    }
    # 2 * 64 * 1000 * 384 ops in 1 ms: 49.2 GOP/s, half of a 98.3 GOP/s int8 rate
    scan = ScanResult("cpu", "gpucache", "int8", 1000, 64, 1e-3, 0.0, 64e3, 1.0)
    limits = {"fp32": 0.01, "int8": 2 * 64 * 1000 * 384 / 1e-3 / 1e12 * 2}
    text = render(
        [
            BenchReport(
                "cpu",
                versions,
                10.0,
                limits,
                scans=[scan],
                embed={"prompts": 4, "gpucache_prompts_per_s": 1.0, "dtype": "x"},
                end_to_end={"prompts": 4, "seconds": 1.0, "prompts_per_s": 4.0, "hit_rate": 0.5},
            )
        ],
        "cmd",
    )
    assert "| gpucache | int8 | 1000 | 64 | 1.00 (0.00) | 64000 | 1.0 | - | 50% |" in text
    assert "fp32 10.0 GFLOP/s, int8 98.3 GOP/s." in text


def test_a_single_query_is_a_fraction_of_the_read_rate_measured_beside_it():
    """On a shared machine the read bandwidth moves minute to minute: Q = 1 is compared with a
    plain read timed in the same blocks, not with the machine figure from the run's start."""
    from speed import BenchReport, ScanResult, render

    versions = {
        "commit": "x",
        "python": "3",
        "torch": "2",
        "cuda": "-",
        "transformers": "5",
        "faiss": "1",
        "machine": "x86_64",
        "cpu_threads": "2",
    }
    scan = ScanResult("cpu", "gpucache", "fp32", 1000, 1, 1e-3, 0.0, 1e3, 3.0, None, 4.0)
    text = render(
        [
            BenchReport(
                "cpu",
                versions,
                50.0,
                {"fp32": 0.1},
                scans=[scan],
                embed={"prompts": 4, "gpucache_prompts_per_s": 1.0, "dtype": "x"},
                end_to_end={"prompts": 4, "seconds": 1.0, "prompts_per_s": 4.0, "hit_rate": 0.5},
            )
        ],
        "cmd",
    )
    assert "| gpucache | fp32 | 1000 | 1 | 1.00 (0.00) | 1000 | 3.0 | 4.0 | 75% |" in text


def test_the_paired_store_comparison_runs_against_a_git_revision():
    """bench/ab_store.py: this checkout's store against HEAD's, both exact enough to compare."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [
            sys.executable,
            str(root / "bench" / "ab_store.py"),
            "--base",
            "HEAD",
            "--n",
            "600",
            "--q",
            "1,8",
            "--mode",
            "int8",
            "--rounds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("commit ") and "torch" in lines[0]
    assert lines[1].startswith("int8, N = 600, k = 4")
    assert lines[2].startswith("Q = 1: base ") and lines[3].startswith("Q = 8: base ")
    assert "(1.0000)" in lines[2]
