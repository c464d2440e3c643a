"""The command line (gpucache/cli.py): the info command end to end, and every command as the
README's first command installs the package, with no extra (tests/test_tiers.py blocks the same
libraries). The demo command is tested with the demo (tests/demo/), calibrate with the guard
(tests/guard/), serve with the server (tests/serve/)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpucache.extras import EXTRAS

NO_EXTRA = sorted(name for names in EXTRAS.values() for name in names)
# the command with each library of every extra taken away before anything imports it
_BLOCKED_MAIN = ("import json, sys\n"
                 "for name in json.loads(sys.argv[1]):\n"
                 "    sys.modules[name] = None\n"
                 "from gpucache.cli import main\n"
                 "sys.exit(main(sys.argv[2:]))\n")


def run_cli(*args: str, blocked: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gpucache", *args] if blocked is None else \
        [sys.executable, "-c", _BLOCKED_MAIN, json.dumps(blocked), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("command", [[], ["demo"], ["calibrate"], ["serve"], ["info"]])
def test_every_commands_help_works_with_no_extra_installed(command):
    result = run_cli(*command, "--help", blocked=NO_EXTRA)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: gpucache {' '.join(command)}".rstrip())


def test_serve_without_its_extra_exits_2_naming_the_extra_to_install():
    result = run_cli("serve", "--upstream", "http://127.0.0.1:9/v1", blocked=NO_EXTRA)
    assert result.returncode == 2
    assert "needs the 'serve' extra" in result.stderr and "pip install 'gpucache[serve]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_info_reports_device_and_no_gpu_without_error_with_no_extra_installed():
    result = run_cli("info", blocked=NO_EXTRA)
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
