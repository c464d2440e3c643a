"""The benchmark's --quick mode runs end to end and reports what it measured."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_quick_writes_a_report(tmp_path):
    out = tmp_path / "bench.md"
    result = subprocess.run(
        [sys.executable, "-m", "gpucache", "bench", "--quick", "--device", "cpu", "--repeat", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    assert "## cpu" in text and "read bandwidth" in text and "get_or_put_all end to end" in text
    data = json.loads(out.with_suffix(".json").read_text())
    scans = data[0]["scans"]
    modes = {s["mode"] for s in scans if s["engine"] == "gpucache"}
    assert modes == {"fp32", "fp16", "bf16", "int8"}
    assert all(s["queries_per_s"] > 0 for s in scans)
    assert all(s["recall_at_k"] >= 0.99 for s in scans
               if s["engine"] == "gpucache" and s["recall_at_k"] is not None)
