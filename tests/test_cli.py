"""The command line (gpucache/cli.py): the info command end to end, and every command as the
README's first command installs the package, with no extra (tests/test_tiers.py blocks the same
libraries). The demo command is tested with the demo (tests/demo/), calibrate with the guard
(tests/guard/), serve with the server (tests/serve/); explain here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpucache.extras import EXTRAS

NO_EXTRA = sorted(name for names in EXTRAS.values() for name in names)
# the command with each library of every extra taken away before anything imports it
_BLOCKED_MAIN = (
    "import json, sys\n"
    "for name in json.loads(sys.argv[1]):\n"
    "    sys.modules[name] = None\n"
    "from gpucache.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def run_cli(*args: str, blocked: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = (
        [sys.executable, "-m", "gpucache", *args]
        if blocked is None
        else [sys.executable, "-c", _BLOCKED_MAIN, json.dumps(blocked), *args]
    )
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "command", [[], ["demo"], ["calibrate"], ["serve"], ["explain"], ["bench"], ["info"]]
)
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
    from gpucache.pairing.meta import shipped_meta

    # the guard's decision, and the pair model by its version, read from its shipped JSON
    assert f"decision='rules'; the pair model pair-model-{shipped_meta().version}" in result.stdout
    from gpucache.devices import resolve_device
    from gpucache.index.paths import resolve_quantization

    device = resolve_device("auto")
    expected = resolve_quantization("auto", device, 384)
    assert f"quantization='auto' stores {expected} on {device}" in result.stdout


def test_explain_names_the_rule_that_refuses_a_near_miss_with_no_extra_installed():
    result = run_cli(
        "explain",
        "how many grams in 3 cups of flour",
        "how many grams in 4 cups of flour",
        "--no-embed",
        blocked=NO_EXTRA,
    )
    assert result.returncode == 0, result.stderr
    assert "guard      reject (numbers): numbers differ: 3 vs 4" in result.stdout
    assert "decision   a miss: the guard refuses (numbers)" in result.stdout


def test_explain_embeds_the_requests_and_serves_a_rewording_above_the_threshold():
    result = run_cli(
        "explain",
        "What is the boiling point of water at sea level?",
        "hi! what's the boiling point of water at sea level? thanks a lot",
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines() if not line.startswith("  "))
    similarity = float(lines["similarity"].split()[0])
    assert similarity >= 0.875 and "(threshold 0.875)" in lines["similarity"]
    assert '  request  "what\'s the boiling point of water at sea level?"' in result.stdout
    assert lines["guard"].startswith("accept") and lines["decision"] == "served"


def test_explain_reads_the_threshold_and_the_skipped_rules_of_a_settings_file(tmp_path):
    config = tmp_path / "gpucache.toml"
    config.write_text('[cache]\nthreshold = 0.99\n\n[guard]\nskip_rules = ["substitution"]\n')
    pair = ("which vitamins are in spinach", "which minerals are in spinach")
    plain = run_cli("explain", *pair, "--no-embed")
    assert "guard      reject (substitution)" in plain.stdout
    skipped = run_cli("explain", *pair, "--config", str(config))
    assert skipped.returncode == 0, skipped.stderr
    assert "guard      accept" in skipped.stdout and "(threshold 0.99)" in skipped.stdout
    assert "decision   a miss: below the threshold" in skipped.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["  ", "what is rust"], "the stored prompt must not be empty"),
        (["what is rust", "what is go", "--config", "/nonexistent/gpucache.toml"], "cannot be read"),
    ],
)
def test_explain_refuses_what_it_cannot_read_with_a_clear_error(args, message):
    result = run_cli("explain", *args, "--no-embed")
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
