"""The ``gpucache calibrate`` command: the threshold and soft rules chosen from a user's own
labelled pairs, printed with their figures and written as TOML the cache and the server read.
The choice itself (folds, bounds, the operating point) is guard/calibration.py; this module
reads the pairs, embeds them as the cache would, and says what was chosen and on what.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def read_pairs(path: str) -> list[tuple[str, str, int]]:
    """(a, b, label) of each line of a JSONL file; ``ValueError`` names the line at fault."""
    import json

    pairs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                a, b, label = row["a"], row["b"], row["label"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a JSON object with a, b and label ({exc})") from None
            if (
                not (isinstance(a, str) and isinstance(b, str) and a.strip() and b.strip())
                or label not in (0, 1)
                or isinstance(label, bool)
            ):
                raise ValueError(f"{path}:{number}: a and b must be non-empty text and label 0 or 1")
            pairs.append((a, b, label))
    return pairs


def run(args: argparse.Namespace) -> int:
    """``gpucache calibrate PAIRS``: the exit status (0 written, 1 no point within the budget,
    2 bad input), what it found printed."""
    import shlex

    import torch
    from transformers.utils import logging as hf_logging

    from gpucache import TransformerEmbedder
    from gpucache.guard.calibration import (
        LEARNED,
        PAIR,
        THRESHOLDS_MILLI,
        Scored,
        candidates,
        choose,
        fold_of,
        interval,
        near,
        similarity_milli,
        skip_sets,
        to_toml,
        upper_bound,
    )
    from gpucache.guard.learned import LearnedDecision
    from gpucache.guard.lexical import LexicalNearMissVerifier
    from gpucache.guard.pair import PairDecision

    try:
        pairs = read_pairs(args.pairs)
    except (OSError, ValueError) as exc:
        print(f"gpucache calibrate: {exc}", file=sys.stderr)
        return 2
    if not 0 < args.budget < 1:
        print("gpucache calibrate: --budget must be in (0, 1)", file=sys.stderr)
        return 2
    hf_logging.disable_progress_bar()
    # fp32 on every machine: the half precision a CPU or GPU would serve in moves similarities by
    # thousandths, and the same pairs would choose another point there (calibration.py)
    embedder = TransformerEmbedder(args.model, device=args.device, dtype=torch.float32)
    verifiers: dict[tuple[str, ...], Any] = {skip: LexicalNearMissVerifier(skip=skip) for skip in skip_sets()}
    verifiers[LEARNED] = LearnedDecision()  # its verdict weighs each pair's similarity
    verifiers[PAIR] = PairDecision(device=str(embedder.device))  # the pair model, float32 as it serves
    guard = verifiers[()]
    # what the cache embeds: each prompt's request text (the same for every set of rules)
    texts = [guard.request(a) for a, _, _ in pairs] + [guard.request(b) for _, b, _ in pairs]
    vectors = embedder.encode(texts)
    n = len(pairs)
    sims = (vectors[:n].double() * vectors[n:].double()).sum(dim=1).tolist()
    # each pair both ways round: the cache may hold either prompt
    scored = [
        Scored(
            label,
            similarity_milli(sim),
            {skip: v.verify(a, b, sim) and v.verify(b, a, sim) for skip, v in verifiers.items()},
            fold_of(a, b),
        )
        for (a, b, label), sim in zip(pairs, sims)
    ]
    choice = choose(scored, args.budget, args.confidence)
    positives = sum(p.label for p in scored)
    held_out = [p for p in scored if p.fold]
    negatives_out = sum(p.label == 0 for p in held_out)
    matmuls = str(embedder.autocast_dtype or embedder.dtype).removeprefix("torch.")
    print(
        f"{n} pairs: {positives} same request, {n - positives} different; budget {args.budget:.2%} "
        f"false hits on the {args.confidence:.0%} upper bound; similarities from {matmuls} embeddings "
        "in float64, compared to 4 places"
    )
    tried = len(candidates(scored)) * len(THRESHOLDS_MILLI)
    print(
        f"the point is chosen on {n - len(held_out)} pairs and its figures and bound are those of the "
        f"other {len(held_out)} (split by a hash of each pair's text): a bound on the pairs that "
        f"chose it would favour the luckiest of {tried:,} candidates"
    )
    if choice is None:
        print(
            "no operating point keeps the false-hit bound within the budget on the held-out half: "
            f"with its {negatives_out} different-request pairs, the bound at 0 served is "
            f"{upper_bound(0, negatives_out, args.confidence):.2%}; "
            "add label-0 pairs or raise the budget",
            file=sys.stderr,
        )
        return 1
    hit_low, hit_high = interval(choice.hits, choice.positives, args.confidence)
    fh_low, fh_high = interval(choice.false_hits, choice.negatives, args.confidence)
    if choice.decision != "rules":
        print(f"threshold {choice.threshold:.3f}, the {choice.decision} decision in place of the soft rules")
    else:
        print(f"threshold {choice.threshold:.3f}, soft rules off: {', '.join(choice.skip_rules) or 'none'}")
    close = near(sims, choice.threshold_milli)
    if close:
        print(
            f"near the threshold: {close} pairs within 0.0005 of it; a cache serving in half precision "
            "(bf16 or fp16 matmuls) may put some on its other side"
        )
    print(
        f"expected hits       {choice.hit_rate:.1%} ({choice.hits} of {choice.positives}; "
        f"{args.confidence:.0%} interval {hit_low:.1%} to {hit_high:.1%})"
    )
    print(
        f"expected false hits {choice.false_hit_rate:.1%} ({choice.false_hits} of {choice.negatives}; "
        f"{args.confidence:.0%} interval {fh_low:.1%} to {fh_high:.1%}, "
        f"upper bound {choice.false_hit_bound:.2%})"
    )
    command = (
        f"gpucache calibrate {shlex.quote(args.pairs)} --budget {args.budget} --confidence {args.confidence}"
    )
    if args.model:
        command += f" --model {shlex.quote(args.model)}"
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(to_toml(choice, command, args.model))
    print(f"wrote {args.out} (SemanticCache.from_config, gpucache serve --config)")
    return 0
