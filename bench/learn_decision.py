"""Would a decision learned from tuning data serve more than the guard's rules? A logistic
regression over gpucache/guard/features.py (and, with ``--maxsim``, how well each word's token
states align with the other prompt's), cross-validated on tuning data, beside the rules; with
``--write``, the same regression fitted on all of it and written as the shipped decision.

    python3 bench/learn_decision.py --out bench/reports/learned-decision.md
    python3 bench/learn_decision.py --maxsim --out /tmp/learned-maxsim.md
    python3 bench/learn_decision.py --floor 0.875 --write gpucache/guard/decision.json

It reads tuning data only, as bench/guard_tuning.py does: the files written for tuning, whole,
and the "tune" half of the others; never a report half or an exam. A pair is a candidate where
its request texts' similarity reaches ``--floor`` (the threshold a cache would scan with), and
refused where a veto (a named rule, either way round) refuses it; the model decides the rest.
Every figure is five-fold cross-validated (a pair is scored by a model fitted without it).
Rows: what the model serves at each cut of its score (in logits), per file, beside the
guard's rules at the default threshold and a threshold alone at the model's rewordings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import string
from collections import Counter
from pathlib import Path

import numpy as np
from guard_tuning import HALVED, WHOLE, similarities
from labelled_pairs import read_jsonl, select_half
from provenance import run_label

from gpucache.cache.settings import DEFAULT_THRESHOLD
from gpucache.guard.features import NAMES, Reader
from gpucache.guard.learned import SCALE

LEARNED = Path("data/llm_prompts_learned_tuning.jsonl")
CUTS = (0, 1, 2, 3)


def fold_of(key: str, folds: int) -> int:
    return hashlib.blake2b(key.encode(), digest_size=4).digest()[0] % folds


def fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float) -> np.ndarray:
    """Weighted, L2-regularised logistic regression by Newton's method on standardised
    columns; the coefficients on the raw columns, the intercept last."""
    mu, sd = x.mean(axis=0), x.std(axis=0)
    sd[sd == 0] = 1.0
    z = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    beta = np.zeros(z.shape[1])
    penalty = np.full(z.shape[1], l2)
    penalty[-1] = 0.0
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(z @ beta)))
        step = np.linalg.solve(
            (z * (w * p * (1 - p))[:, None]).T @ z + np.diag(penalty), z.T @ (w * (p - y)) + penalty * beta
        )
        beta -= step
        if np.abs(step).max() < 1e-9:
            break
    coef = beta[:-1] / sd
    return np.append(coef, beta[-1] - (coef * mu).sum())


def load(floor: float, reader: Reader) -> list[dict]:
    files = [(p, read_jsonl(p)) for p in [*WHOLE, LEARNED] if p.exists()]
    files += [(p, select_half(read_jsonl(p), "tune", p)) for p in HALVED if p.exists()]
    pairs, cache = [], Path(".cache/guard-tuning")
    for path, rows in files:
        a, b = [str(r["a"]) for r in rows], [str(r["b"]) for r in rows]
        ra, rb = [reader.rules.request(s) for s in a], [reader.rules.request(s) for s in b]
        sims, raw = similarities(ra, rb, cache), similarities(a, b, cache)
        for r, x, y, qa, qb, s, s_raw in zip(rows, a, b, ra, rb, sims, raw):
            old = reader.rules.explain(x, y), reader.rules.explain(y, x)
            pairs.append(
                {
                    "file": path.name,
                    "id": str(r.get("id", f"{x}\x00{y}")),
                    "label": int(r["label"]),
                    "requests": (qa, qb),
                    "raw": s_raw,
                    "similarity": s,
                    "reading": reader.read(x, y, s) if s >= floor else None,
                    "rules": s >= DEFAULT_THRESHOLD and not any(v.rejected for v in old),
                }
            )
    return pairs


def maxsim(pairs: list[dict]) -> np.ndarray:
    """Per pair: the mean of each token's best cosine with the other prompt's tokens (both ways),
    the worst token's, and how many tokens align below 0.6: the embedder's token states, fp32."""
    import torch

    from gpucache import TransformerEmbedder

    embedder = TransformerEmbedder(device="cpu")
    tokenizer, model = embedder._tokenizer, embedder._model.float()

    def states(text: str) -> torch.Tensor:
        t = tokenizer([text], truncation=True, max_length=128, return_tensors="pt")
        with torch.no_grad():
            h = model(**t).last_hidden_state[0]
        names = tokenizer.convert_ids_to_tokens(t["input_ids"][0].tolist())
        keep = [i for i, n in enumerate(names) if n not in ("[CLS]", "[SEP]") and n not in string.punctuation]
        return torch.nn.functional.normalize(h[keep], dim=1) if keep else torch.zeros(1, h.shape[1])

    out = []
    for p in pairs:
        m = states(p["requests"][0]) @ states(p["requests"][1]).T
        ra, rb = m.max(dim=1).values, m.max(dim=0).values
        out.append(
            [
                float(ra.mean() + rb.mean()) / 2,
                float(min(ra.min(), rb.min())),
                int((ra < 0.6).sum() + (rb < 0.6).sum()),
            ]
        )
    return np.array(out)


def cut_at_rules(pairs: list[dict], scores: dict[int, float]) -> float:
    """The lowest cut (in steps of 0.05 logits) at which the cross-validated model serves no
    more near-misses than the rules, averaged over the files (each file counts alike)."""
    files = sorted({p["file"] for p in pairs})

    def near_misses(served) -> float:  # type: ignore[no-untyped-def]
        shares = []
        for f in files:
            neg = [p for p in pairs if p["file"] == f and p["label"] == 0]
            shares.append(sum(served(p) for p in neg) / max(1, len(neg)))
        return sum(shares) / len(shares)

    target = near_misses(lambda p: p["rules"])
    for step in range(-40, 121):
        cut = step / 20
        if near_misses(lambda p, cut=cut: scores.get(id(p), -99.0) > cut) <= target:
            return cut
    raise SystemExit("no cut serves as few near-misses as the rules")


def drift(decided: list[dict]) -> int:
    """How many thousandths the requests' similarity moves between this machine's default
    precision and float32 matmuls, at most, over the pairs the model decides (rounded up, and
    at least one: a similarity on a rounding boundary moves a step by itself)."""
    import torch

    from gpucache import TransformerEmbedder

    exact = TransformerEmbedder(device="cpu", dtype=torch.float32)
    a = exact.encode([p["requests"][0] for p in decided])
    b = exact.encode([p["requests"][1] for p in decided])
    moved = ((a * b).sum(dim=1).clamp(max=1.0) - torch.tensor([p["similarity"] for p in decided])).abs()
    return max(1, int(np.ceil(float(moved.max()) * 1000)))


def write(
    path: Path, pairs: list[dict], decided: list[dict], x: np.ndarray, beta: np.ndarray, cut: float
) -> None:
    """The decision as the guard ships it: integer weights in millionths of a logit per unit,
    the training pairs' mean per feature (contributions are read against it), the score at
    that mean, the cut, and the similarity's drift."""
    weights = [int(round(float(b) * SCALE)) for b in beta[:-1]]
    centre = [int(round(float(c))) for c in x.mean(axis=0)]
    base = int(round(float(beta[-1]) * SCALE)) + sum(w * c for w, c in zip(weights, centre))
    doc = {
        "about": "the guard's learned decision (gpucache/guard/learned.py): a logistic regression "
        "over gpucache/guard/features.py, fitted on tuning data only",
        "command": f"python3 bench/learn_decision.py --floor {DEFAULT_THRESHOLD} --write {path}",
        "made_at": label(),
        "trained_on": sorted({p["file"] for p in decided}),
        "pairs": len(decided),
        "names": list(NAMES),
        "weights": weights,
        "centre": centre,
        "base": base,
        "cut": int(round(cut * SCALE)),
        "drift": drift(decided),
    }
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}: cut {cut:.2f} logits (cross-validated: as few near-misses as the rules)")


def label() -> str:
    """The run's commit and machine, and the precision of the similarities (embedded here by
    the default CPU embedder, kept in .cache/guard-tuning)."""
    from gpucache import TransformerEmbedder

    return run_label(TransformerEmbedder(device="cpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor", type=float, default=0.8)
    parser.add_argument("--l2", type=float, default=1.0)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--maxsim", action="store_true", help="add the token states' alignment")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--write", type=Path, help="fit on all tuning pairs and write the shipped decision here"
    )
    args = parser.parse_args()
    pairs = load(args.floor, Reader())
    decided = [p for p in pairs if p["reading"] is not None and p["reading"].veto is None]
    x = np.array([p["reading"].values for p in decided], dtype=float)
    if args.maxsim:
        x = np.hstack([x, maxsim(decided)])
    y = np.array([p["label"] for p in decided], dtype=float)
    # every file counts alike: a large public set does not outvote the prompts a cache sees
    per_file = Counter(p["file"] for p in decided)
    w = np.array([len(decided) / len(per_file) / per_file[p["file"]] for p in decided])
    folds = np.array([fold_of(p["file"] + p["id"], args.folds) for p in decided])
    score = np.zeros(len(decided))
    for k in range(args.folds):
        beta = fit(x[folds != k], y[folds != k], w[folds != k], args.l2)
        score[folds == k] = x[folds == k] @ beta[:-1] + beta[-1]
    scores = {id(p): s for p, s in zip(decided, score)}
    chosen = cut_at_rules(pairs, scores)
    if args.write:
        if args.maxsim:
            raise SystemExit("the shipped decision reads no token states: --write without --maxsim")
        write(args.write, pairs, decided, x, fit(x, y, w, args.l2), chosen)
    flags = f"{'--maxsim ' if args.maxsim else ''}--floor {args.floor}"
    lines = [
        "# A decision learned from tuning data, beside the guard's rules",
        "",
        f"`python3 bench/learn_decision.py {flags}`; {label()}",
        "",
        "Rewordings / near-misses served, five-fold cross-validated on tuning data. *cut c*: the "
        "model serves a pair the vetoes let pass whose score is above c logits; "
        f"**cut {chosen:.2f}**: the lowest (in steps of 0.05) at which it serves no more near-misses "
        "than the rules, averaged over the files (the cut --write ships). *rules*: the rules "
        f"decision at {DEFAULT_THRESHOLD}. *T*: near-misses a threshold alone serves at the model's "
        f"rewordings at cut {chosen:.2f}. *ceiling*: rewordings at or above the floor that no veto "
        "refuses.",
        "",
        "| file | pairs (1/0) | "
        + " | ".join(f"cut {c}" for c in (*CUTS, f"**{chosen:.2f}**"))
        + f" | rules | T at cut {chosen:.2f} | ceiling |",
        "|---|---:|" + "---:|" * (len(CUTS) + 4),
    ]
    means: list[list[float]] = []
    for f in sorted({p["file"] for p in pairs}):
        rows = [p for p in pairs if p["file"] == f]
        pos, neg = [p for p in rows if p["label"] == 1], [p for p in rows if p["label"] == 0]

        def share(served: list[bool], of: list[dict]) -> str:
            return f"{sum(served) / len(of):.1%}"

        cells = [
            share([scores.get(id(p), -99) > c for p in pos], pos)
            + " / "
            + share([scores.get(id(p), -99) > c for p in neg], neg)
            for c in (*CUTS, chosen)
        ]
        rules = share([p["rules"] for p in pos], pos) + " / " + share([p["rules"] for p in neg], neg)
        h2 = sum(scores.get(id(p), -99) > chosen for p in pos)
        means.append(
            [
                h2 / len(pos),
                sum(scores.get(id(p), -99) > chosen for p in neg) / len(neg),
                sum(p["rules"] for p in pos) / len(pos),
                sum(p["rules"] for p in neg) / len(neg),
            ]
        )
        ranked = sorted((p["raw"] for p in pos), reverse=True)
        t = ranked[h2 - 1] if h2 else 1.0
        alone = sum(p["raw"] >= t for p in neg) / len(neg)
        ceiling = sum(id(p) in scores for p in pos) / len(pos)
        lines.append(
            f"| {f} | {len(pos)}/{len(neg)} | "
            + " | ".join(cells)
            + f" | {rules} | {alone:.1%} (at {t:.3f}) | {ceiling:.1%} |"
        )
    m = np.mean(np.array(means), axis=0)
    lines += [
        "",
        f"Averaged over the files (each alike): at cut {chosen:.2f} {m[0]:.1%} of rewordings at {m[1]:.1%} "
        f"of near-misses served; the rules {m[2]:.1%} at {m[3]:.1%}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
