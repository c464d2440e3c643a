"""What the pair model costs: per candidate pair on this CPU (one thread and two, alone and
batched), and a semantic hit's median through the library with the rules and with the pair
decision, alternated in one run.

    python3 bench/pair_cost.py --out bench/reports/pair-cost.md

Pairs: the tuning files' pairs (their text only; labels unused). *alone*: ``scores`` on one pair
at a time, as a lookup with one candidate asks; *batched*: 8 and 32 pairs a call, as a lookup
batch's candidates are scored together (``PairDecision.prepare``), time per pair. The library
rows: a cache holding the ``a`` prompts of the tuning pairs, asked each ``b`` whose request's
similarity reaches the threshold (a semantic candidate), one ``get`` at a time, the rules' cache
and the pair decision's asked in turn, prompt by prompt, so that both meet the machine alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from labelled_pairs import read_jsonl
from provenance import run_label

from gpucache import LexicalNearMissVerifier, SemanticCache, StoreEverything, TransformerEmbedder
from gpucache.guard.pair import PairDecision
from gpucache.pairing.model import PairModel

FILES = [
    Path("data/llm_prompts_chat_tuning.jsonl"),
    Path("data/llm_prompts_natural_tuning.jsonl"),
    Path("data/llm_prompts_tuning.jsonl"),
]


def per_pair(model: PairModel, pairs: list[tuple[str, str]], size: int) -> list[float]:
    out = []
    for i in range(0, len(pairs) - size + 1, size):
        started = time.perf_counter()
        model.scores(pairs[i : i + size])
        out.append((time.perf_counter() - started) * 1000 / size)
    return out


def row(name: str, times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    median, mean = statistics.median(times), statistics.fmean(times)
    return f"| {name} | {median:.2f} | {mean:.2f} | {p99:.2f} | {len(times)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [r for f in FILES for r in read_jsonl(f)]
    pairs = [(str(r["a"]), str(r["b"])) for r in rows][: args.pairs]
    model = PairModel("cpu")
    model.scores(pairs[:8])  # the first call's one-off costs
    lines = [
        "# The pair model's cost",
        "",
        f"`python3 bench/pair_cost.py`: {run_label(None)}; the pair model in float32",
        "",
        "## Per candidate pair (milliseconds a pair)",
        "",
        "| threads, call | median | mean | p99 | calls |",
        "|---|---:|---:|---:|---:|",
    ]
    threads = torch.get_num_threads()
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        for size in (1, 8, 32):
            lines.append(
                row(
                    f"{n} thread{'s' if n > 1 else ''}, {'alone' if size == 1 else f'{size} a call'}",
                    per_pair(model, pairs, size),
                )
            )
    torch.set_num_threads(threads)
    embedder = TransformerEmbedder(device="cpu")
    caches = {
        "rules": SemanticCache(
            embedder, device="cpu", verifier=LexicalNearMissVerifier(), cache_policy=StoreEverything()
        ),
        "pair": SemanticCache(
            embedder, device="cpu", verifier=PairDecision(model), cache_policy=StoreEverything()
        ),
    }
    stored = list(dict.fromkeys(str(r["a"]) for r in rows))
    for cache in caches.values():
        cache.warm([(p, f"answer {i}") for i, p in enumerate(stored)])
    asked = [str(r["b"]) for r in rows if str(r["b"]) not in set(stored)]
    times: dict[str, list[float]] = {name: [] for name in caches}
    served = {name: 0 for name in caches}
    for prompt in asked:
        for name, cache in caches.items():
            started = time.perf_counter()
            hit = cache.get(prompt)
            elapsed = (time.perf_counter() - started) * 1000
            if hit is not None and not hit.exact:
                times[name].append(elapsed)
                served[name] += 1
    lines += [
        "",
        f"## A semantic hit through the library (milliseconds a `get`; {len(stored)} prompts stored, "
        f"{len(asked)} asked, alternated)",
        "",
        "| decision | median | mean | p99 | hits timed |",
        "|---|---:|---:|---:|---:|",
        *(row(name, t) for name, t in times.items() if t),
    ]
    both = {name: statistics.median(t) for name, t in times.items() if t}
    if len(both) == 2:
        lines += [
            "",
            f"The pair decision's median semantic hit is {both['pair'] / both['rules']:.2f}x the rules'.",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
