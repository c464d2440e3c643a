"""The guard on its tuning data: what it serves of each kind, beside a threshold alone, and the
pairs it gets wrong. The loop the guard's rules, word lists and tables were tuned with.

    python3 bench/guard_tuning.py --show rewording --show substitution

It reads tuning data only: the files written for tuning, whole (``--whole``), and the "tune"
half of the others (``half_of`` in labelled_pairs.py); the report halves are left to
``bench/false_hits.py`` and the exams to ``bench/guard_exam.py``. Each pair is judged both
ways round and served only if both ways serve it: the cache may hold either prompt. The
defaults embed each prompt's request text (what the cache embeds); the threshold alone embeds
the prompt as sent (a cache without the guard). Similarities are kept in ``--cache``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path

from labelled_pairs import read_jsonl, select_half

from gpucache.cache.settings import DEFAULT_THRESHOLD
from gpucache.guard.lexical import LexicalNearMissVerifier

WHOLE = [
    Path("data/llm_prompts_chat_tuning.jsonl"),
    Path("data/llm_prompts_tuning.jsonl"),
    Path("data/llm_prompts_natural_tuning.jsonl"),
]
HALVED = [
    Path("data/llm_prompts.jsonl"),
    Path("../shared/data/qqp.jsonl"),
    Path("../shared/data/paws_wiki.jsonl"),
]


def similarities(texts_a: list[str], texts_b: list[str], cache: Path) -> list[float]:
    """Cosine similarity of each pair of texts, from ``cache`` where already embedded."""
    cache.mkdir(parents=True, exist_ok=True)
    stored = cache / "similarities.json"
    known: dict[str, float] = json.loads(stored.read_text()) if stored.exists() else {}

    def key(x: str, y: str) -> str:
        return hashlib.sha256(f"{x}\x00{y}".encode("utf-8", "surrogatepass")).hexdigest()[:24]

    todo = [(x, y) for x, y in zip(texts_a, texts_b) if key(x, y) not in known]
    if todo:
        from gpucache import TransformerEmbedder

        embedder = TransformerEmbedder(device="cpu")
        for i in range(0, len(todo), 512):
            chunk = todo[i : i + 512]
            v = embedder.encode([x for x, _ in chunk] + [y for _, y in chunk])
            n = len(chunk)
            for (x, y), s in zip(chunk, (v[:n] * v[n:]).sum(dim=1).clamp(max=1.0).tolist()):
                known[key(x, y)] = s
        stored.write_text(json.dumps(known))
    return [known[key(x, y)] for x, y in zip(texts_a, texts_b)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whole", nargs="*", type=Path, default=WHOLE)
    parser.add_argument("--halved", nargs="*", type=Path, default=HALVED)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument(
        "--show",
        action="append",
        default=[],
        help="print the pairs above the threshold this rule decided wrongly "
        "('rewording' for near-misses let through)",
    )
    parser.add_argument("--kind", action="append", default=[], help="only print pairs of these kinds")
    parser.add_argument("--cache", type=Path, default=Path(".cache/guard-tuning"))
    parser.add_argument("--skip", action="append", default=[], help="rules to switch off")
    args = parser.parse_args()
    guard = LexicalNearMissVerifier(skip=args.skip)
    files = [(p, read_jsonl(p)) for p in args.whole] + [
        (p, select_half(read_jsonl(p), "tune", p)) for p in args.halved if p.exists()
    ]
    print(
        f"| file | label | pairs | defaults served | threshold alone at {args.threshold} | "
        "threshold alone at the defaults' rewordings: near-misses |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for path, rows in files:
        a = [str(r["a"]) for r in rows]
        b = [str(r["b"]) for r in rows]
        sims = similarities([guard.request(x) for x in a], [guard.request(y) for y in b], args.cache)
        raw = similarities(a, b, args.cache)
        verdicts = []
        for x, y in zip(a, b):
            v1, v2 = guard.explain(x, y), guard.explain(y, x)
            verdicts.append(v1 if v1.rejected else v2)
        served = [s >= args.threshold and not v.rejected for s, v in zip(sims, verdicts)]
        labels = [int(r["label"]) for r in rows]
        n1, n0 = labels.count(1), labels.count(0)
        hits = sum(ok and lab == 1 for ok, lab in zip(served, labels))
        wrong = sum(ok and lab == 0 for ok, lab in zip(served, labels))
        ranked = sorted((s for s, lab in zip(raw, labels) if lab == 1), reverse=True)
        t_same = ranked[hits - 1] if hits else 1.0
        alone_wrong = sum(s >= t_same and lab == 0 for s, lab in zip(raw, labels))
        alone1 = sum(s >= args.threshold and lab == 1 for s, lab in zip(raw, labels))
        alone0 = sum(s >= args.threshold and lab == 0 for s, lab in zip(raw, labels))
        print(f"| {path.name} | 1 | {n1} | {hits / max(n1, 1):.1%} | {alone1 / max(n1, 1):.1%} | |")
        print(
            f"| {path.name} | 0 | {n0} | {wrong / max(n0, 1):.1%} | {alone0 / max(n0, 1):.1%} | "
            f"{alone_wrong / max(n0, 1):.1%} (at {t_same:.3f}) |"
        )
        kinds: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            kinds[(str(r.get("kind", "-")), labels[i])].append(i)
        if "kind" in rows[0]:
            for (kind, lab), idx in sorted(kinds.items(), key=lambda kv: (kv[0][1], kv[0][0])):
                above = [i for i in idx if sims[i] >= args.threshold]
                rules = Counter(verdicts[i].rule for i in above if verdicts[i].rejected)
                print(
                    f"|   {kind} | {lab} | {len(idx)} | {sum(served[i] for i in idx)} served, "
                    f"{len(above)} above | {dict(rules)} | |"
                )
        for i, r in enumerate(rows):
            rule = verdicts[i].rule if verdicts[i].rejected else "rewording"
            if args.kind and str(r.get("kind")) not in args.kind:
                continue
            is_wrong = (verdicts[i].rejected and labels[i] == 1) or (served[i] and labels[i] == 0)
            if rule in args.show and sims[i] >= args.threshold and is_wrong:
                print(
                    f"    [{rule}] {sims[i]:.3f} {r.get('kind', '')}: {r['a']!r} / {r['b']!r}"
                    f" -- {verdicts[i]}"
                )


if __name__ == "__main__":
    main()
