"""Mutation testing of the rules that decide: each one-line change mutmut makes to a target
module, and whether the tests that cover it fail (the mutant is killed) or pass (it survives).

A surviving mutant is a change to a verdict, an admission or an eviction that no test notices.
The run works on a copy of the committed tree (``git archive HEAD``), so the checkout is never
touched; mutmut (the ``dev`` extra) mutates the targets and, for each mutant, runs the tests
that its statistics pass found covering the mutated function.

    python3 bench/mutation.py --out bench/reports/mutation.md
    python3 bench/mutation.py --targets gpucache/policy/admission.py --tests tests/policy

The report lists every survivor with its diff. Why a survivor is left (an equivalent mutant,
or a change that only moves a cost) is written under it by hand after the run, in the section
the script leaves for it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

from provenance import run_label

ROOT = Path(__file__).resolve().parents[1]
TARGETS = (
    "gpucache/guard/parsing.py",
    "gpucache/guard/payload.py",
    "gpucache/policy/admission.py",
    "gpucache/policy/content.py",
    "gpucache/cache/entries.py",
)
TESTS = ("tests/guard/", "tests/policy/", "tests/cache/test_cache.py", "tests/cache/test_entries.py")

# mutmut puts the mutated copy first on sys.path; an editable install's import hook would still
# hand the tests the checkout's own package, so it is taken out before mutmut starts
BOOT = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
sys.modules.pop("gpucache", None)
from mutmut.__main__ import cli
sys.argv = ["mutmut", *sys.argv[1:]]
cli()
"""


def prepare(
    work: Path, targets: tuple[str, ...], tests: tuple[str, ...], timeout_multiplier: float = 15.0
) -> None:
    """The committed tree, unpacked into ``work``, with mutmut's settings in its pyproject."""
    paths = ["gpucache", "tests", "data", "bench", "pyproject.toml"]
    archive = subprocess.run(
        ["git", "archive", "HEAD", *paths], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(work, filter="data")
    settings = (
        "\n[tool.mutmut]\n"
        'source_paths = ["gpucache/"]\n'
        f"only_mutate = {json.dumps([str(Path(t)) for t in targets])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(list(tests))}\n"
        'also_copy = ["data/", "bench/"]\n'  # tests of the data read bench's modules
        "use_git_change_detection = false\n"
        # a mutant's CPU time limit: (its tests' estimated time + 1 s) x this x 2
        f"timeout_multiplier = {timeout_multiplier}\n"
        # torch's thread pools do not survive a fork: each worker is forked from a
        # server that has imported the tests but run nothing
        'process_isolation = "forkserver"\n'
    )
    with open(work / "pyproject.toml", "a", encoding="utf-8") as f:
        f.write(settings)


def mutmut(work: Path, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one core a worker
    return subprocess.run(
        [sys.executable, "-c", BOOT, *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def outcomes(work: Path, targets: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Each target's mutants and their status, read from mutmut's records."""
    from mutmut.stats import status_by_exit_code

    found: dict[str, dict[str, str]] = {}
    for target in targets:
        meta = work / "mutants" / (target + ".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        found[target] = {name: status_by_exit_code[code] for name, code in codes.items()}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS))
    parser.add_argument("--tests", nargs="+", default=list(TESTS))
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--out", default=None, help="the report to write (markdown)")
    parser.add_argument(
        "--timeout-multiplier",
        type=float,
        default=15.0,
        help="mutmut's: a mutant slower than (its tests' time + 1 s) x this x 2 is a "
        "timeout (15, mutmut's default, lets a mutant that loops run for minutes)",
    )
    args = parser.parse_args()
    targets, tests = tuple(args.targets), tuple(args.tests)
    label = run_label()
    with tempfile.TemporaryDirectory(prefix="gpucache-mutation-") as name:
        work = Path(name)
        prepare(work, targets, tests, args.timeout_multiplier)
        started = time.monotonic()
        run = mutmut(work, "run", "--max-children", str(args.max_children))
        seconds = time.monotonic() - started
        if run.returncode != 0:
            print(run.stdout[-4000:], run.stderr[-4000:], sep="\n", file=sys.stderr)
            raise SystemExit(f"mutmut run failed ({run.returncode})")
        found = outcomes(work, targets)
        diffs = {
            name: mutmut(work, "show", name).stdout.strip()
            for per_file in found.values()
            for name, status in per_file.items()
            if status != "killed"
        }
    shown = Path(args.out).resolve() if args.out else None
    if shown is not None and shown.is_relative_to(ROOT):
        shown = shown.relative_to(ROOT)
    command = "python3 bench/mutation.py" + (f" --out {shown}" if shown else "")
    if tuple(args.targets) != TARGETS:
        command += " --targets " + " ".join(targets)
    if tuple(args.tests) != TESTS:
        command += " --tests " + " ".join(tests)
    if args.timeout_multiplier != 15.0:
        command += f" --timeout-multiplier {args.timeout_multiplier:g}"
    lines = [
        "# Mutation testing: the rules that decide",
        "",
        f"Command: `{command}` ({label}; mutmut's run took {seconds / 60:.0f} min on "
        f"{args.max_children} processes). Every mutant of each target below, and the tests "
        f"that cover it among {', '.join(f'`{t}`' for t in tests)}.",
        "",
        "| module | mutants | killed | survived | other |",
        "|---|---:|---:|---:|---:|",
    ]
    for target, per_file in found.items():
        counts = Counter(per_file.values())
        other = sum(n for status, n in counts.items() if status not in ("killed", "survived"))
        lines.append(
            f"| `{target}` | {len(per_file)} | {counts['killed']} | {counts['survived']} | {other} |"
        )
    lines += [
        "",
        "## Survivors and why each is left",
        "",
        "Each survivor's diff; under it, written after the run, why it is left.",
        "",
    ]
    for per_file in found.values():
        for name, status in sorted(per_file.items()):
            if status == "killed":
                continue
            lines += [f"### `{name}` ({status})", "", "```diff", diffs.get(name, ""), "```", ""]
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
