"""Exact hits through the proxy: this checkout against another revision, alternated in one
session. bench/serve.py's exact-hit cells (1, 16 and 64 clients, and 8 beside 32 clients of
misses that saturate the embedder), for each revision's own ``gpucache serve``.

Why alternated: on a shared machine two runs minutes apart differ by more than most changes do;
here each round runs the other revision, then this one, in front of the same upstream, so the
machine's drift falls on both alike, and the spread between rounds is shown beside the cells.

    python3 bench/serve_ab.py --base 2e1d037 --rounds 2 --seconds 5 --out bench/reports/serve-ab.md

The other revision's package is extracted from git into a folder of its own, and its proxy runs
there (``python -m gpucache serve`` with that folder first on the path), so each proxy is its
own revision's code with this machine's installed dependencies.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from provenance import run_label
from serve import STANDIN, Cell, finish_wrk, free_port, prime, proxy_command, start, start_wrk, stop, workload

ROOT = Path(__file__).resolve().parents[1]


def extracted(revision: str, into: Path) -> str:
    """``revision``'s package unpacked into ``into``; its full commit id."""
    commit = subprocess.run(
        ["git", "rev-parse", revision], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", commit, "gpucache"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return commit


def proxy(up_port: int, where: Path | None) -> tuple[subprocess.Popen[bytes], str]:
    """A proxy of the revision in ``where`` (None: this checkout) and its base URL. It runs with
    ``where`` as its working folder, which ``python -m`` puts first on its path."""
    port = free_port()
    command = proxy_command(up_port, "--port", str(port))
    env = dict(os.environ)
    if where is not None:
        env["PYTHONPATH"] = str(where)
    here = os.getcwd()
    os.chdir(where or ROOT)
    try:
        process = start(command, f"http://127.0.0.1:{port}/health", env=env)
    finally:
        os.chdir(here)
    return process, f"http://127.0.0.1:{port}"


def cells(base: str, repeats: list[str], seconds: float) -> dict[str, Cell]:
    url = f"{base}/v1/chat/completions"
    prime(url, repeats)
    out = {}
    for clients in (1, 16, 64):
        out[f"exact hit, {clients} clients"] = finish_wrk(start_wrk(url, repeats, clients, seconds, "exact"))
    misses = start_wrk(url, ["ab UNIQUE: what is the sum?"], 32, seconds)
    out["exact hit, 8 clients beside 32 of misses"] = finish_wrk(start_wrk(url, repeats, 8, seconds, "exact"))
    finish_wrk(misses)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other revision (a commit, tag or branch)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one cell")
    parser.add_argument("--out", default="bench/reports/serve-ab.md")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("bench/serve_ab.py needs wrk (Debian: apt-get install wrk)")
    work = Path(tempfile.mkdtemp(prefix="gpucache-serve-ab-"))
    base_commit = extracted(args.base, work)
    up_port = free_port()
    upstream = start(
        [sys.executable, str(STANDIN), "--port", str(up_port), "--token-delay", "0.002"],
        f"http://127.0.0.1:{up_port}/v1/models",
    )
    repeats = [first for first, _ in workload()]
    runs: dict[str, list[dict[str, Cell]]] = {"base": [], "this": []}
    try:
        for _ in range(args.rounds):
            for name, where in (("base", work), ("this", None)):
                process, base = proxy(up_port, where)
                try:
                    runs[name].append(cells(base, repeats, args.seconds))
                finally:
                    stop(process)
    finally:
        stop(upstream)
        shutil.rmtree(work, ignore_errors=True)

    def shown(values: list[float]) -> str:
        return " / ".join(f"{1000 * v:.1f}" for v in values)

    lines = [
        "# Exact hits through the proxy: this revision against another, alternated",
        "",
        f"Command: `python3 bench/serve_ab.py --base {args.base} --rounds {args.rounds} "
        f"--seconds {args.seconds} --out {args.out}` ({run_label()}); base: commit {base_commit[:7]}.",
        "",
        "Each round runs the base revision's proxy, then this one's, in front of the same stand-in "
        "upstream (0.002 s per word), each with its revision's defaults and a key, the load from wrk "
        "(one thread) on the same machine. Each cell, round by round: p50 and p99 in ms, requests/s, "
        "and the answers checked to be exact hits (`x-gpucache: exact`) of all answered.",
        "",
        "| cell | revision | p50 (ms) | p99 (ms) | requests/s | exact / answered |",
        "|---|---|---|---|---|---|",
    ]
    for cell in runs["this"][0]:
        for name, label in (("base", f"base {base_commit[:7]}"), ("this", "this")):
            got = [r[cell] for r in runs[name]]
            rates = " / ".join(f"{c.rate:.0f}" for c in got)
            checked = " / ".join(f"{c.ok}/{c.ok + c.wrong}" for c in got)
            p50, p99 = shown([c.p50 for c in got]), shown([c.p99 for c in got])
            lines.append(f"| {cell} | {label} | {p50} | {p99} | {rates} | {checked} |")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"took {time.monotonic() - started:.0f} s", file=sys.stderr)
