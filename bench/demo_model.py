"""The demo in front of a real model: SmolLM2-135M-Instruct generating for the misses.

    python3 bench/demo_model.py --limit 60 --out bench/reports/demo-smollm2.md

The first ``--limit`` prompts of the demo workload go through ``get_or_put_all`` in batches of
16 in front of SmolLM2 (greedy, ``--max-new-tokens``), as ``gpucache demo --model smollm2``
runs them; then the same prompts, in the same batches, through the same model without the
cache. Both generation times are measured in this one process; the cache's own cost is its
embedding and scanning seconds (``cache.stats()``). Needs ``bash scripts/install.sh
demo-model``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from provenance import run_label  # noqa: E402

from gpucache import SemanticCache
from gpucache.demo.local_model import LocalModel
from gpucache.demo.replay import load_workload, run_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", default="bench/reports/demo-smollm2.md")
    args = parser.parse_args()

    started = time.perf_counter()
    model = LocalModel.smollm2(max_new_tokens=args.max_new_tokens)
    loaded = time.perf_counter() - started
    cache = SemanticCache(device="cpu")
    report = run_demo(cache, model=model, batch_size=args.batch_size, limit=args.limit)
    prompts = [item.prompt for item in load_workload()[: args.limit]]
    bare = LocalModel(model.model, model.tokenizer, name=model.name, max_new_tokens=args.max_new_tokens)
    for offset in range(0, len(prompts), args.batch_size):
        bare(prompts[offset : offset + args.batch_size])

    hits = report.exact_hits + report.semantic_hits
    lines = [
        "# The demo in front of SmolLM2-135M-Instruct",
        "",
        f"Command: `python3 bench/demo_model.py --limit {args.limit} --out {args.out}` ({run_label()}). "
        f"The model: {model.name}, loaded in {loaded:.0f} s, "
        f"greedy, at most {args.max_new_tokens} new tokens an answer, one batched `generate` call for the "
        f"misses of each batch of {args.batch_size} prompts. The cache: the defaults "
        f"(threshold {cache.threshold}, verifier {cache.verifier.name}), on {cache.device}.",
        "",
        "| | with the cache | without |",
        "|---|---:|---:|",
        f"| prompts | {report.prompts} | {len(prompts)} |",
        f"| answers generated | {report.generated} | {bare.generated} |",
        f"| served from the cache | {hits} ({report.exact_hits} exact, {report.semantic_hits} semantic; "
        f"{report.hit_rate:.1%}) | – |",
        "| wrong answers served (a different question's, by the workload's labels) | "
        f"{report.false_hits} | – |",
        f"| generation seconds (measured) | {report.model_seconds:.1f} | {bare.seconds:.1f} |",
        f"| the cache's own seconds (embedding and scanning) | {report.cache_seconds:.1f} | – |",
        f"| wall seconds of the replay | {report.seconds:.1f} | – |",
        "",
        f"Generation time with the cache: {report.model_seconds / bare.seconds:.2f}x the time without it; "
        f"the cache itself cost {report.cache_seconds:.1f} s of the "
        f"{bare.seconds - report.model_seconds:.1f} s it saved.",
        "",
    ]
    if report.examples:
        lines += ["Served for a reworded prompt (similarity):", ""]
        lines += [f"- {sim:.3f} `{new}` <- `{cached}`" for new, cached, sim in report.examples]
        lines.append("")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
