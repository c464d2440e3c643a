"""One key's flood beside another key's misses: what the proxy's defaults give a second tenant.

    python3 bench/serve_fairness.py --out bench/reports/serve-fairness.md [--seconds 15]

For each configuration, in front of the same stand-in upstream (tests/standin_upstream.py,
``--token-delay`` seconds per word), a fresh ``gpucache serve`` is started and measured:

- **alone**: another key (``sk-victim``) sends ``--misses`` new prompts one after another, each
  a miss; the p50 and p99 of what each took, end to end;
- **beside a flood**: the same, while one key (``sk-flood``) keeps 32 connections of new
  prompts busy (wrk, a load generator in C); the flood's answers counted by status;
- **one key alone**: the flood's key by itself, 32 connections of new prompts: the misses a
  second it gets served, so a deployment with one key is seen to lose nothing to the share.

The configurations: the defaults; the share turned off (``--max-tenant-concurrency none``, the
defaults before the share bound by default); and a share with a rate (``--max-tenant-concurrency
4 --tenant-rate 10``), the settings the docs named before. The victim's p50 beside the flood over
its p50 alone is the figure the defaults are held to (within 3x).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import httpx
from provenance import run_label
from serve import STANDIN, Cell, finish_wrk, free_port, percentile, proxy_command, start, start_wrk, stop

CONFIGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the defaults", ()),
    ("no share (`--max-tenant-concurrency none`)", ("--max-tenant-concurrency", "none")),
    (
        "`--max-tenant-concurrency 4 --tenant-rate 10`",
        ("--max-tenant-concurrency", "4", "--tenant-rate", "10"),
    ),
)
FLOOD = "sk-flood"
VICTIM = {"authorization": "Bearer sk-victim"}


def victim_misses(
    url: str, label: str, n: int, key: dict[str, str] = VICTIM, until: float = float("inf")
) -> tuple[float, float, int]:
    """(p50 ms, p99 ms, answers that were not a 200 miss) of up to ``n`` new prompts sent one
    after another with ``key``, none begun past ``until`` (``time.monotonic``); the times are
    those of the 200 misses only (a refusal is quick, and would flatter the p50)."""
    took, wrong = [], 0
    with httpx.Client(timeout=60, headers=key) as client:
        for i in range(n):
            began = time.perf_counter()
            if time.monotonic() >= until:
                break
            response = client.post(
                url,
                json={
                    "model": "bench",
                    "messages": [{"role": "user", "content": f"{label} {i}: what is {i} times {i + 7}?"}],
                },
            )
            if response.status_code != 200 or response.headers.get("x-gpucache") != "miss":
                wrong += 1
            else:
                took.append(1000 * (time.perf_counter() - began))
    return percentile(took, 0.5), percentile(took, 0.99), wrong


def flood_of_misses(url: str, seconds: float) -> tuple:  # type: ignore[type-arg]
    return start_wrk(url, ["flood UNIQUE: what is the sum?"], 32, seconds, "miss", key=FLOOD)


def timed_out(base: str) -> float:
    """Lookups that passed their deadline and went upstream so far (/metrics)."""
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith('gpucache_errors_total{kind="cache"}'):
            return float(line.split()[1])
    return 0.0


def measure(up_port: int, flags: tuple[str, ...], args: argparse.Namespace) -> dict[str, object]:
    """One proxy: the flood's key alone first (before the victim's key is ever heard from),
    then the victim alone, then the victim beside the flood, every one of its requests begun
    and answered while the flood runs."""
    port = free_port()
    proxy = start(proxy_command(up_port, "--port", str(port), *flags), f"http://127.0.0.1:{port}/health")
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/chat/completions"
    try:
        victim_misses(url, "warm", 10, key={"authorization": f"Bearer {FLOOD}"})  # the embedder warm
        lone: Cell = finish_wrk(flood_of_misses(url, args.seconds))
        victim_misses(url, "warm", 10)  # the victim's key checked
        alone = victim_misses(url, "alone", args.misses)
        before = timed_out(base)
        began = time.monotonic()
        flood = flood_of_misses(url, args.seconds)
        time.sleep(2)  # a load generator's ramp: the flood is on before the victim asks
        beside = victim_misses(url, "beside", args.misses, until=began + args.seconds - 3)
        flooded: Cell = finish_wrk(flood)
        late = timed_out(base) - before
    finally:
        stop(proxy)
    return {"alone": alone, "beside": beside, "flood": flooded, "lone": lone, "timed_out": late}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/reports/serve-fairness.md")
    parser.add_argument("--token-delay", type=float, default=0.002, help="upstream seconds per word")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each flood")
    parser.add_argument("--misses", type=int, default=100, help="most of the victim's misses per cell")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("bench/serve_fairness.py needs wrk (Debian: apt-get install wrk)")
    up_port = free_port()
    upstream = start(
        [sys.executable, str(STANDIN), "--port", str(up_port), "--token-delay", str(args.token_delay)],
        f"http://127.0.0.1:{up_port}/v1/models",
    )
    results = []
    try:
        for label, flags in CONFIGS:
            results.append((label, measure(up_port, flags, args)))
    finally:
        stop(upstream)
    lines = [
        "# One key's flood beside another key's misses",
        "",
        f"`python3 bench/serve_fairness.py --seconds {args.seconds:g} --misses {args.misses}"
        f" --token-delay {args.token_delay:g}`; {run_label()}.",
        "",
        "The victim: one key's new prompts one after another (each a miss), alone and while one "
        "other key keeps 32 connections of new prompts busy (wrk). One key alone: the flood's key "
        "by itself. Milliseconds end to end of the victim's 200 misses (its other answers, such "
        "as a rate limit's 429s, are counted below the row), on this machine, the proxy, the "
        "stand-in upstream and the load all on its cores.",
        "",
        "| configuration | victim alone p50 / p99 | beside the flood p50 / p99 | ratio of p50s "
        "| the flood: answered 200 / refused | lookups past their deadline meanwhile "
        "| one key alone: misses/s, p50 |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in results:
        alone, beside = r["alone"], r["beside"]
        flood, lone = r["flood"], r["lone"]
        assert isinstance(alone, tuple) and isinstance(beside, tuple)
        assert isinstance(flood, Cell) and isinstance(lone, Cell)
        lines.append(
            f"| {label} | {alone[0]:.1f} / {alone[1]:.1f} | {beside[0]:.1f} / {beside[1]:.1f} "
            f"| {beside[0] / alone[0]:.1f}x | {flood.requests - flood.errors} / {flood.errors} "
            f"| {r['timed_out']:.0f} | {lone.ok / lone.seconds:.0f}, {1000 * lone.p50:.0f} |"
        )
        if alone[2] or beside[2]:
            lines.append(
                f"|  (the victim's answers not a 200 miss: {alone[2]} of {args.misses} alone, "
                f"{beside[2]} beside) |"
            )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
