"""The verifier on the tuning half: what each rule stops and costs, and the pairs it gets wrong.

The loop the guard's rules, word lists and table were tuned with. It only ever reads the
"tune" half of each file (``half_of`` in labelled_pairs.py); the report half is left to
``bench/false_hits.py``, which quotes it, so no figure in the report was fitted to its own rows.
Similarities are embedded once per file and kept in ``--cache`` between runs.

    python bench/guard_tuning.py data/llm_prompts.jsonl ../shared/data/qqp.jsonl \\
        --whole data/llm_prompts_tuning.jsonl --show added --show rewording

``--whole`` files are tuning data only (``data/llm_prompts_tuning.jsonl``: written for tuning,
never measured by ``bench/false_hits.py``), so they are read whole.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path

from labelled_pairs import read_jsonl, select_half

from gpucache.cache.settings import DEFAULT_THRESHOLD
from gpucache.guard.lexical import LexicalNearMissVerifier


def similarities(path: Path, rows: list[dict[str, object]], cache: Path) -> list[float]:
    """Cosine similarity of each pair, from the cache when the file has not changed."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    stored = cache / f"{path.stem}-{digest}.json"
    if stored.exists():
        by_id: dict[str, float] = json.loads(stored.read_text())
    else:
        from gpucache import TransformerEmbedder

        embedder = TransformerEmbedder(device="cpu")
        everything = read_jsonl(path)
        a = [str(r["a"]) for r in everything]
        b = [str(r["b"]) for r in everything]
        vectors = embedder.encode(a + b)
        sims = (vectors[: len(a)] * vectors[len(a):]).sum(dim=1).clamp(max=1.0).tolist()
        by_id = {str(r["id"]): s for r, s in zip(everything, sims)}
        cache.mkdir(parents=True, exist_ok=True)
        stored.write_text(json.dumps(by_id))
    return [by_id[str(r["id"])] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="*", type=Path)
    parser.add_argument("--whole", nargs="*", type=Path, default=[],
                        help="tuning-only pair files, read whole (never reported)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--show", action="append", default=[],
                        help="print the tune-half pairs above the threshold that this rule "
                        "decided wrongly ('rewording' for near-misses let through)")
    parser.add_argument("--cache", type=Path, default=Path(".cache/guard-tuning"))
    args = parser.parse_args()
    verifier = LexicalNearMissVerifier()
    files = [(path, "tune half") for path in args.pairs] + [(path, "whole") for path in args.whole]
    for path, part in files:
        rows = read_jsonl(path) if part == "whole" else select_half(read_jsonl(path), "tune", path)
        sims = similarities(path, rows, args.cache)
        above = [(r, s) for r, s in zip(rows, sims) if s >= args.threshold]
        verdicts = [(r, s, verifier.explain(str(r["a"]), str(r["b"]))) for r, s in above]
        label0 = sum(r["label"] == 0 for r in rows)
        label1 = len(rows) - label0
        served0 = sum(r["label"] == 0 and not v.rejected for r, _, v in verdicts)
        served1 = sum(r["label"] == 1 and not v.rejected for r, _, v in verdicts)
        only0 = sum(r["label"] == 0 for r, _ in above)
        only1 = sum(r["label"] == 1 for r, _ in above)
        print(f"\n== {path.name} ({part}, {len(rows)} pairs, threshold {args.threshold})")
        print(f"threshold only: false hits {only0}/{label0} = {only0 / max(label0, 1):.1%}, "
              f"hits {only1}/{label1} = {only1 / max(label1, 1):.1%}")
        print(f"with verifier:  false hits {served0}/{label0} = {served0 / max(label0, 1):.1%}, "
              f"hits {served1}/{label1} = {served1 / max(label1, 1):.1%}")
        by_rule: Counter[tuple[str, int]] = Counter(
            (v.rule, int(r["label"])) for r, _, v in verdicts if v.rejected
        )
        rules = sorted({rule for rule, _ in by_rule})
        print("rejected above the threshold, label 0 / label 1: " + ", ".join(
            f"{rule} {by_rule[rule, 0]}/{by_rule[rule, 1]}" for rule in rules))
        kinds = sorted({str(r.get("kind", "")) for r in rows} - {""})
        for kind in kinds:
            mine = [(r, v) for r, _, v in verdicts if r.get("kind") == kind]
            total = sum(r.get("kind") == kind for r in rows)
            served = sum(not v.rejected for _, v in mine)
            print(f"  {kind:22s} served {served:3d} of {total:3d} "
                  f"(above threshold {len(mine)})")
        for rule in args.show:
            for r, s, v in verdicts:
                wrong = (v.rejected and r["label"] == 1) or (not v.rejected and r["label"] == 0)
                if wrong and v.rule == rule:
                    print(f"  [{r['label']}] {s:.3f} {r['a']!r} | {r['b']!r}\n      {v}")


if __name__ == "__main__":
    main()
