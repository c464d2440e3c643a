"""The command line (gpucache/cli.py): the info command end to end. The demo command is tested
with the demo (tests/demo/), calibrate with the guard (tests/guard/), serve with the server
(tests/serve/)."""

from __future__ import annotations

import subprocess
import sys


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
    from gpucache.devices import resolve_device
    from gpucache.index.store import resolve_quantization

    device = resolve_device("auto")
    expected = resolve_quantization("auto", device, 384)
    assert f"quantization='auto' stores {expected} on {device}" in result.stdout
