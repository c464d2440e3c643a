"""``gpucache bench`` end to end (gpucache/benchmark/runner.py through the command): its --quick
mode runs every cell on this machine and writes the three files, each saying what it measured
and on what."""

from __future__ import annotations

import json
import subprocess
import sys

import torch


def test_bench_quick_writes_a_report(tmp_path, real_embedder):
    out = tmp_path / "bench.md"
    result = subprocess.run(
        [sys.executable, "-m", "gpucache", "bench", "--quick", "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    # the three files, the plot a PNG
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert f"wrote {out.with_suffix('.png')}" in result.stderr
    assert text.startswith(
        f"# gpucache bench\n\nReproduce: `gpucache bench --quick --device cpu --out {out}`"
    )
    # progress, one line per step, with the run's clock
    assert "cpu: scan int8, N = 10,000, Q = 64: gpucache int8, faiss int8, faiss fp32" in result.stderr
    assert "cpu: done in " in result.stderr
    run = json.loads(out.with_suffix(".json").read_text())[0]["run"]
    assert run["sizes"] == [10_000] and run["query_batches"] == [1, 64] and run["skipped"] == []
    assert 0 < run["peak_bytes"] < run["total_bytes"] and 0 < run["available_bytes"] <= run["total_bytes"]
    assert f"peak held {run['peak_bytes'] / 2**30:.2f} GiB" in text and "Nothing left out." in text
    assert run["missing"] == []  # the test extras install every peer
    versions = json.loads(out.with_suffix(".json").read_text())[0]["versions"]
    from gpucache import __version__

    assert versions["gpucache"] == __version__ and versions["commit"] in text
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
    # every gpucache row has FAISS's flat index timed in its own cell, as has every other FAISS row
    assert all(s["flat_queries_per_s"] > 0 for s in scans if s["engine"] == "gpucache")
    assert all(
        (s["flat_queries_per_s"] is None) == (s["mode"] == "fp32") for s in scans if s["engine"] == "faiss"
    )
    assert "| vs FAISS same precision |" in text and "FAISS's OpenMP pool set to" in text
    latency = data[0]["latency"]
    assert set(latency["ms"]) >= {
        "get (miss)",
        "get_or_put (semantic hit)",
        "get_or_put (miss)",
        "sentence-transformers encode, batch 1",  # the yardstick, installed with the test extras
    }
    yardstick = latency["ms"]["sentence-transformers encode, batch 1"]["p50"]
    ratio = latency["ms"]["get (miss)"]["p50"] / yardstick
    assert f"| {ratio:.2f}x |" in text
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


def test_a_missing_peer_is_named_with_its_install_hint(monkeypatch):
    import importlib.util

    from gpucache.benchmark import runner

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "faiss" else real(name))
    assert runner.missing_peers() == ["the scan's yardstick (FAISS): pip install 'gpucache[bench]'"]


def test_without_faiss_a_cell_is_gpucaches_alone(monkeypatch):
    from gpucache.benchmark import scan

    monkeypatch.setitem(sys.modules, "faiss", None)  # an import of it fails
    assert scan._faiss_engines(torch.zeros(4, 384), "fp16") == []


def test_with_cuda_present_the_default_runs_the_gpu_against_the_cpu(monkeypatch):
    from gpucache.benchmark import runner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runner.devices_for("all") == [torch.device("cpu"), torch.device("cuda")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runner.devices_for("all") == [torch.device("cpu")]


def test_each_device_gets_its_share_of_the_time_left_and_the_scans_come_last(monkeypatch):
    """Two devices in 10 minutes: the first device's scans must end by its half (less the
    limits measured again at its end); the second gets what the first left. The cells whose
    cost is fixed run before the scans, which the plan bounds."""
    from gpucache.benchmark import runner

    now = [0.0]
    order: list[str] = []

    def step(name, seconds, result):
        def run(*args, **kwargs):
            order.append(name)
            now[0] += seconds
            return result

        return run

    monkeypatch.setattr(runner, "machine_limits", step("limits", 5.0, (10.0, {"fp32": 0.1})))
    monkeypatch.setattr(runner, "bench_embedder", step("embedder", 20.0, {}))
    monkeypatch.setattr(runner, "bench_end_to_end", step("end to end", 10.0, {}))
    monkeypatch.setattr(runner, "bench_latency", step("latency", 30.0, {}))
    monkeypatch.setattr(runner, "bench_overhead", step("overhead", 10.0, {}))
    monkeypatch.setattr(runner, "total_bytes", lambda device: 2**34)
    monkeypatch.setattr(runner, "available_bytes", lambda device: 2**33)
    monkeypatch.setattr(runner, "peak_bytes", lambda device: 2**30)
    monkeypatch.setattr(runner, "reset_peak", lambda device: None)
    deadlines = []

    def scans(device, sizes, qs, modes, k, repeat, plan, **kwargs):
        order.append("scans")
        deadlines.append(plan.deadline)
        now[0] = plan.deadline  # the scans take all they are given
        return []

    monkeypatch.setattr(runner, "bench_scan", scans)
    devices = [torch.device("cpu"), torch.device("cpu")]  # two device runs, whatever they are
    reports = runner.run_bench(
        devices, runner.BenchOptions(minutes=10), progress=lambda line: None, clock=lambda: now[0]
    )
    per_device = ["limits", "embedder", "end to end", "latency"] + ["overhead"] * 3 + ["scans", "limits"]
    assert order == per_device * 2
    # the first: 300 s, less its end's limits (5 s); the second: from 300 s to 600 s, less 5 s
    assert deadlines == [300.0 - 5.0, 600.0 - 5.0]
    assert [round(r.run["seconds"]) for r in reports] == [300, 300]
