"""How the pair model chooses its floor and cut, cross-validated across tuning files it never
learned from; with ``--write``, the cut chosen on all of them and the measured margin written into
the weights' JSON.

    python3 bench/pair_tuning.py --out bench/reports/pair-tuning.md
    python3 bench/pair_tuning.py --weights /tmp/pm1 --write

It reads the tuning files the pair model was not trained on (``HELD_OUT`` in
gpucache/pairing/training/pairs.py: the files written for tuning, whole, and the tuning half of the
others), never a report half or an exam. Per pair: its request texts' similarity, the default
guard's verdict at the default threshold, the vetoes' (the named rules, either way round) and the
pair model's rounded score. A design is a floor (the similarity a candidate must reach) and a cut
(the score it must pass): for each file, the design serving the most rewordings on the *other*
files with no more near-misses than ``--budget`` (the mean of their shares) is measured on it.
Beside it, the rules as they ship, and a threshold alone at the same rewordings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from guard_tuning import similarities  # noqa: E402
from labelled_pairs import read_jsonl, select_half  # noqa: E402
from provenance import run_label  # noqa: E402

from gpucache.cache.settings import DEFAULT_THRESHOLD  # noqa: E402
from gpucache.guard.lexical import LexicalNearMissVerifier  # noqa: E402
from gpucache.guard.pair import PairDecision  # noqa: E402
from gpucache.pairing.model import META_FILE, PairModel  # noqa: E402
from gpucache.pairing.training.pairs import HELD_OUT  # noqa: E402

WHOLE = {
    "data/llm_prompts_chat_tuning.jsonl",
    "data/llm_prompts_tuning.jsonl",
    "data/llm_prompts_natural_tuning.jsonl",
    "data/llm_prompts_learned_tuning.jsonl",
}
# The floors a design may take: the cache's threshold by default (a lower floor needs a lower
# threshold, which the cache's settings own); --floors studies lower ones
FLOORS = (DEFAULT_THRESHOLD,)
# the second table: what a floor below the threshold would buy
STUDY_FLOORS = (0.70, 0.75, 0.80, 0.85, DEFAULT_THRESHOLD)
CUTS = tuple(range(-400, 601, 50))  # hundredths of a logit


def load(model: PairModel) -> list[dict]:
    decision = PairDecision(model)
    rules = LexicalNearMissVerifier()
    pairs = []
    for name in HELD_OUT:
        path = Path(name)
        rows = read_jsonl(path)
        rows = rows if name in WHOLE else select_half(rows, "tune", path)
        a, b = [str(r["a"]) for r in rows], [str(r["b"]) for r in rows]
        sims = similarities(
            [rules.request(x) for x in a], [rules.request(y) for y in b], Path(".cache/guard-tuning")
        )
        vetoes = [decision.veto(x, y) for x, y in zip(a, b)]
        todo = [i for i, v in enumerate(vetoes) if v.rule == "pass"]
        scores: list[int | None] = [None] * len(rows)
        for start in range(0, len(todo), 32):
            chunk = todo[start : start + 32]
            for i, s in zip(chunk, model.scores([(a[i], b[i]) for i in chunk])):
                scores[i] = s
        for r, x, y, s, v, score in zip(rows, a, b, sims, vetoes, scores):
            ruled = not any(rules.explain(p, q).rejected for p, q in ((x, y), (y, x)))
            pairs.append(
                {
                    "file": path.name,
                    "label": int(r["label"]),
                    "similarity": s,
                    "veto": v.rule,
                    "score": score,
                    "rules": s >= DEFAULT_THRESHOLD and ruled,
                    "ruled": ruled,
                }
            )
        print(f"{path.name}: {len(rows)} pairs", flush=True)
    return pairs


class Table:
    """The pairs as arrays, for the design grid: per pair its file, label, similarity, whether a
    veto refused it, whether its requests read the same, its score (``nan`` unscored) and whether
    the full rules accept it (either way round)."""

    def __init__(self, pairs: list[dict]) -> None:
        self.files = sorted({p["file"] for p in pairs})
        self.file = np.array([self.files.index(p["file"]) for p in pairs])
        self.label = np.array([p["label"] for p in pairs])
        self.similarity = np.array([p["similarity"] for p in pairs])
        self.vetoed = np.array([p["veto"] not in ("pass", "identical") for p in pairs])
        self.identical = np.array([p["veto"] == "identical" for p in pairs])
        self.score = np.array([np.nan if p["score"] is None else p["score"] for p in pairs], dtype=float)
        self.ruled = np.array([p["ruled"] for p in pairs])
        self.rules = np.array([p["rules"] for p in pairs])

    def served(self, design: Design, margin: int) -> np.ndarray:
        """Which pairs a design serves: past the floor and the vetoes, the score against the
        cut for pairs the soft rules refuse (``over``) or accept (``under``); an unscored pair
        as the rules say."""
        floor, over, under = design
        scored = ~np.isnan(self.score)
        cut = np.where(self.ruled, under, over) + margin
        passes = np.where(scored, np.nan_to_num(self.score, nan=-1e9) > cut, self.ruled)
        return (self.similarity >= floor) & ~self.vetoed & (self.identical | passes)

    def shares(self, served: np.ndarray, files: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per file: the share of its rewordings and of its near-misses served."""
        reword, near = [], []
        for f in files:
            mine = self.file == f
            reword.append(served[mine & (self.label == 1)].mean())
            near.append(served[mine & (self.label == 0)].mean())
        return np.array(reword), np.array(near)


Design = tuple[float, int, int]  # floor; cut where the soft rules refuse; cut where they accept
NEVER = 10**6  # a cut no score passes: the soft rules' refusal stands


def designs(floors: tuple[float, ...] = FLOORS) -> list[Design]:
    """The grid: the model alone past the vetoes (one cut), and the soft rules kept with the
    model overriding a refusal past one cut and refusing an acceptance below another."""
    out: list[Design] = []
    for floor in floors:
        out += [(floor, cut, cut) for cut in CUTS]
        out += [(floor, over, under) for over in (*CUTS, NEVER) for under in CUTS if under < over]
        out.append((floor, NEVER, -NEVER))  # the rules alone at this floor
    return out


def choose(table: Table, files: list[int], margin: int, floors: tuple[float, ...] = FLOORS) -> Design:
    """The design serving the most rewordings on ``files`` (the mean of their shares) with no
    more near-misses than the rules as they ship (the mean of theirs)."""
    _, rules_near = table.shares(table.rules, files)
    best, best_reword = (DEFAULT_THRESHOLD, NEVER, -NEVER), -1.0
    for design in designs(floors):
        reword, near = table.shares(table.served(design, margin), files)
        if near.mean() <= rules_near.mean() + 1e-9 and reword.mean() > best_reword:
            best, best_reword = design, reword.mean()
    return best


def describe(design: Design) -> str:
    floor, over, under = design
    if over == NEVER and under == -NEVER:
        return f"the rules alone at {floor:.3f}"
    if over == under:
        return f"{floor:.3f}, the model alone: cut {over / 100:+.2f}"
    lifted = "never" if over == NEVER else f"{over / 100:+.2f}"
    kept = f"{floor:.3f}, rules kept: a refusal lifted past {lifted}"
    return f"{kept}, an acceptance refused below {under / 100:+.2f}"


def ranking(table: Table, least: float = 0.75) -> list[str]:
    """Per file, how well the score alone ranks rewordings above near-misses among the pairs it
    scores whose similarity reaches ``least``: the ROC AUC (ties count half)."""
    lines = ["| file | pairs scored | ROC AUC of the score |", "|---|---:|---:|"]
    for f, name in enumerate(table.files):
        mine = (table.file == f) & ~np.isnan(table.score) & (table.similarity >= least)
        pos, neg = table.score[mine & (table.label == 1)], table.score[mine & (table.label == 0)]
        if len(pos) and len(neg):
            wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
            lines.append(f"| {name} | {int(mine.sum())} | {wins / (len(pos) * len(neg)):.3f} |")
    return lines


def threshold_at(table: Table, f: int, reword: float) -> tuple[float, float]:
    """A threshold alone serving at least ``reword`` of file ``f``'s rewordings: its threshold and
    the near-misses it then serves."""
    mine = table.file == f
    for t in sorted(set(np.round(table.similarity[mine], 4)), reverse=True):
        served = table.similarity >= t
        r, n = table.shares(served, [f])
        if r[0] >= reword:
            return float(t), float(n[0])
    return 0.0, 1.0


def report(table: Table, margin: int, floors: tuple[float, ...] = FLOORS) -> tuple[list[str], Design]:
    lines = [
        "| file | pairs | design chosen on the other files | pair model: rewordings / near-misses | "
        "rules as they ship | threshold alone at equal rewordings: near-misses |",
        "|---|---:|---|---|---|---|",
    ]
    every = list(range(len(table.files)))
    for f in every:
        design = choose(table, [g for g in every if g != f], margin, floors)
        r, n = table.shares(table.served(design, margin), [f])
        rr, rn = table.shares(table.rules, [f])
        t, tn = threshold_at(table, f, float(r[0]))
        lines.append(
            f"| {table.files[f]} | {int((table.file == f).sum())} | {describe(design)} | "
            f"{100 * r[0]:.1f}% / {100 * n[0]:.1f}% | {100 * rr[0]:.1f}% / {100 * rn[0]:.1f}% | "
            f"{100 * tn:.1f}% (at {t:.3f}) |"
        )
    return lines, choose(table, every, margin, floors)


def drift(model: PairModel, pairs: list[tuple[str, str]]) -> tuple[int, int]:
    """How far a rounded score moves between one pass over a batch and each pair alone, and
    under bfloat16 autocast on the CPU, at most, in hundredths (at least one)."""
    import torch

    batch = model.scores(pairs)
    alone = [model.scores([p])[0] for p in pairs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model.scores(pairs)
    moved = [abs(x - y) for x, y in zip(batch, alone) if x is not None and y is not None]
    moved += [abs(x - y) for x, y in zip(batch, low) if x is not None and y is not None]
    by_batch = [abs(x - y) for x, y in zip(batch, alone) if x is not None and y is not None]
    return max(1, max(moved, default=1)), max(by_batch, default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, help="a trained folder (default: the shipped weights)")
    parser.add_argument("--drift-pairs", type=int, default=48)
    parser.add_argument(
        "--floors", type=float, nargs="+", default=list(FLOORS), help="floors a design may take"
    )
    parser.add_argument("--pairs-json", type=Path, help="keep every pair's readings here (for study)")
    parser.add_argument(
        "--write", action="store_true", help="write the design chosen on every file and the margin"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = PairModel("cpu", args.weights)
    pairs = load(model)
    if args.pairs_json:
        args.pairs_json.write_text(json.dumps(pairs))
    sample = []
    for name in HELD_OUT:
        rows = read_jsonl(Path(name))
        sample += [(str(r["a"]), str(r["b"])) for r in rows[: max(1, args.drift_pairs // len(HELD_OUT))]]
    margin, batch_moved = drift(model, sample)
    table = Table(pairs)
    lines, overall = report(table, margin, tuple(args.floors))
    study, study_overall = report(table, margin, STUDY_FLOORS)
    weights = f" --weights {args.weights}" if args.weights else ""
    if tuple(args.floors) != FLOORS:
        weights += " --floors " + " ".join(str(f) for f in args.floors)
    head = [
        "# The pair model's design, cross-validated across tuning files it never learned from",
        "",
        f"`python3 bench/pair_tuning.py{weights}`: {run_label()}; the pair model in float32 on the CPU",
        "",
        f"Weights: {model.name} ({args.weights or 'shipped'}); {int((~np.isnan(table.score)).sum())} pairs "
        f"scored. Margin measured: {margin} hundredths of a logit (a batch against each pair alone: "
        f"{batch_moved}; float32 against bfloat16 autocast on this CPU; {len(sample)} pairs). For each "
        "file, the design serving the most rewordings on the other files (the mean of their shares) "
        "with no more near-misses than the rules as they ship there, measured on the file. The rules' "
        "own figures are in sample: their words and thresholds were tuned on these files.",
        "",
        f"## At the cache's threshold ({', '.join(f'{f:.3f}' for f in args.floors)})",
        "",
        *lines,
        "",
        f"Chosen on every file: {describe(overall)}.",
        "",
        f"## With a floor of its own ({', '.join(f'{f:.3f}' for f in STUDY_FLOORS)}; the cache's "
        "threshold lowered with it): a study, not shipped",
        "",
        *study,
        "",
        f"Chosen on every file: {describe(study_overall)}.",
        "",
        "## The score alone: how it ranks rewordings above near-misses (similarity 0.75 and above)",
        "",
        *ranking(table),
    ]
    text = "\n".join(head) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.write:
        folder = args.weights or Path("gpucache/pairing/weights")
        meta = json.loads((folder / META_FILE).read_text())
        meta["floor"] = int(round(overall[0] * 1000))
        meta["cut"], meta["keep_cut"] = overall[1], overall[2]
        meta["margin"] = margin
        (folder / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        print(f"wrote {folder / META_FILE}: {describe(overall)}, margin {margin}")


if __name__ == "__main__":
    main()
