"""What the guard costs per candidate pair: the rules and the learned decision, on this CPU.

    python3 bench/guard_cost.py --out bench/reports/guard-cost.md

The cache asks its verifier once per candidate above the threshold, on the lookup's thread and
outside the lock, so its time adds to a semantic lookup's. Pairs: every pair of the tuning
files (their text only; labels unused), each judged once as the cache judges it (stored prompt
first). *cold*: the verifier's memos cleared before the pass, so every prompt is read for the
first time (a cache's first lookups); *warm*: the same pass again (a stored prompt asked about
often, as a cache's popular entries are). Figures per pair: the mean, the median and the 99th
percentile of single timings.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from labelled_pairs import read_jsonl
from provenance import run_label

from gpucache import LearnedDecision, LexicalNearMissVerifier
from gpucache.guard.lexical import clear_caches

FILES = [
    Path("data/llm_prompts_chat_tuning.jsonl"),
    Path("data/llm_prompts_natural_tuning.jsonl"),
    Path("data/llm_prompts_tuning.jsonl"),
    Path("data/llm_prompts_learned_tuning.jsonl"),
]
TARGET_MS = 0.5


def timed(judge, pairs: list[tuple[str, str]]) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for a, b in pairs:
        started = time.perf_counter()
        judge(a, b)
        out.append((time.perf_counter() - started) * 1000)
    return out


def row(name: str, times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"| {name} | {statistics.fmean(times):.3f} | {statistics.median(times):.3f} | {p99:.3f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pairs = [(str(r["a"]), str(r["b"])) for f in FILES for r in read_jsonl(f)]
    rules, learned = LexicalNearMissVerifier(), LearnedDecision()
    deciders = {
        "rules (`explain`)": lambda a, b: rules.explain(a, b),
        "learned (`judge`, at 0.9)": lambda a, b: learned.judge(a, b, 0.9),
    }
    lines = [
        "# The guard's cost per candidate pair",
        "",
        f"`python3 bench/guard_cost.py`; {run_label(None)}; one thread",
        "",
        f"{len(pairs)} pairs of the tuning files, each judged once per pass; milliseconds per pair. "
        f"Target: under {TARGET_MS} ms per candidate pair.",
        "",
        "| decision, pass | mean | median | p99 |",
        "|---|---:|---:|---:|",
    ]
    for name, judge in deciders.items():
        clear_caches()
        cold = timed(judge, pairs)
        warm = timed(judge, pairs)
        lines += [row(f"{name}, cold", cold), row(f"{name}, warm", warm)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
