"""An earlier bench/serve.py report's cells beside a new one's: ``python3 bench/serve.py --before
OLD.md`` appends the table this module builds.

    python3 bench/serve_compare.py OLD NEW    # the same table for two reports (files or REV:PATH)

Cells are matched by their row's path and clients (the latency table and the table of exact
hits beside saturating misses); the miss's overhead beyond embedding and scanning and the
batched semantic hits/s by their sentences. A cell one report lacks is shown as "–". The two
reports are two runs, not one: the ratios carry the machine's run-to-run noise, which a
report's own in-run ratios do not.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

ROW = re.compile(r"^\| ([^|]+?) \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \|", re.M)
BEYOND = re.compile(r"([\d.]+) ms\s+beyond embedding and scanning")
BATCHED = re.compile(r"^\| batched across requests \(window 2 ms\) \| (\d+) \|", re.M)


def read(source: str) -> str:
    """A report from a file, or ``REV:PATH`` from git (a committed report, reproducibly)."""
    if Path(source).is_file() or ":" not in source:
        return Path(source).read_text(encoding="utf-8")
    return subprocess.run(["git", "show", source], capture_output=True, text=True, check=True).stdout


def cells(report: str) -> dict[tuple[str, int], tuple[float, float, float]]:
    """(path, clients) -> (p50 ms, p99 ms, requests/s) of every table row of a report."""
    found = {}
    for label, clients, _n, p50, p99, rate in ROW.findall(report):
        found[(label.strip(), int(clients))] = (float(p50), float(p99), float(rate))
    return found


def _one(pattern: re.Pattern[str], report: str) -> float | None:
    match = pattern.search(report)
    return float(match.group(1)) if match else None


def before_and_after(before: str, after: str) -> list[str]:
    old, new = cells(before), cells(after)
    lines = [
        "",
        "## Before and after",
        "",
        "The earlier report given with `--before` beside this run, cell by cell (two runs).",
        "",
        "| path | clients | p50 before | p50 after | p99 before | p99 after | req/s before "
        "| req/s after | after / before req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def show(value: float | None) -> str:
        return "–" if value is None else f"{value:g}"

    for key in sorted(set(old) | set(new), key=lambda k: (k[0], k[1])):
        a, b = old.get(key), new.get(key)
        ratio = f"{b[2] / a[2]:.2f}x" if a and b and a[2] else "–"
        lines.append(
            f"| {key[0]} | {key[1]} | {show(a and a[0])} | {show(b and b[0])} | "
            f"{show(a and a[1])} | {show(b and b[1])} | {show(a and a[2])} | {show(b and b[2])} "
            f"| {ratio} |"
        )
    lines += [
        "",
        f"A miss's overhead beyond embedding and scanning (ms, p50): before "
        f"{show(_one(BEYOND, before))}, after {show(_one(BEYOND, after))}. Semantic hits/s at 64 "
        f"clients, batched: before {show(_one(BATCHED, before))}, after {show(_one(BATCHED, after))}.",
        "",
    ]
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args()
    print("\n".join(before_and_after(read(args.before), read(args.after))))
