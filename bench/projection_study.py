"""Would a small learned projection on top of the pooled embedding serve more rewordings at as few
near-misses? A study on tuning data only (#47, item 2), before anything is built into the cache.

Every tuning pair (the tuning files whole, the "tune" half of the others, as bench/guard_tuning.py
reads them) is embedded once as the cache embeds it (its request text, the shipped
all-MiniLM-L6-v2). A projection ``W = I + A`` (384 x 384; ``--rank`` r makes ``A`` a product of
two r-wide matrices) is fitted so that the cosine of ``W x`` and ``W y`` is high for a pair that
should share an answer, low for a near-miss and for a prompt paired with another pair's prompt,
``A`` kept small. Each file is held out in turn: the projection is fitted on the others, its
threshold chosen there so that the guard and the threshold together serve as many near-misses as
the cache does today (threshold 0.875), and the held-out file is then judged both ways: what the
cache serves today, and what it would serve through the projection. The guard's verdicts are the
same in both (they read the text, not the vectors).

    python3 bench/projection_study.py --out bench/reports/projection-study.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from guard_tuning import HALVED, WHOLE
from labelled_pairs import read_jsonl, select_half
from provenance import run_label

from gpucache.cache.settings import DEFAULT_THRESHOLD
from gpucache.guard.lexical import LexicalNearMissVerifier

WHOLE_FILES = [*WHOLE, Path("data/llm_prompts_learned_tuning.jsonl")]


def load(guard: LexicalNearMissVerifier) -> list[tuple[str, list[dict], list[bool]]]:
    """(file name, rows, the guard's verdict: served by the guard both ways round) per file."""
    files = [(p, read_jsonl(p)) for p in WHOLE_FILES] + [
        (p, select_half(read_jsonl(p), "tune", p)) for p in HALVED if p.exists()
    ]
    out = []
    for path, rows in files:
        passed = [
            not guard.explain(str(r["a"]), str(r["b"])).rejected
            and not guard.explain(str(r["b"]), str(r["a"])).rejected
            for r in rows
        ]
        out.append((path.name, rows, passed))
    return out


class Projection(torch.nn.Module):
    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.rank = rank
        if rank >= dim:
            self.a = torch.nn.Parameter(torch.zeros(dim, dim))
        else:
            self.u = torch.nn.Parameter(torch.randn(dim, rank) * 0.01)
            self.v = torch.nn.Parameter(torch.zeros(rank, dim))

    def delta(self) -> torch.Tensor:
        return self.a if hasattr(self, "a") else self.u @ self.v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x + x @ self.delta(), dim=-1)


def fit(x: torch.Tensor, y: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace) -> Projection:
    """``W`` from pairs (x_i, y_i) labelled 1 (share an answer) or 0 (a near-miss)."""
    torch.manual_seed(0)
    model = Projection(x.shape[1], args.rank)
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    same, near = labels == 1, labels == 0
    for _ in range(args.steps):
        px, py = model(x), model(y)
        cos = (px * py).sum(-1)
        loss = torch.relu(args.high - cos[same]).pow(2).mean()
        loss = loss + torch.relu(cos[near] - args.low).pow(2).mean()
        shuffled = py[torch.randperm(len(py))]  # another pair's prompt: unrelated
        loss = loss + torch.relu((px * shuffled).sum(-1) - args.apart).pow(2).mean()
        loss = loss + args.keep * model.delta().pow(2).sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model


def served(cos: torch.Tensor, passed: list[bool], threshold: float) -> list[bool]:
    return [bool(c >= threshold) and ok for c, ok in zip(cos.tolist(), passed)]


def rates(flags: list[bool], labels: list[int]) -> tuple[float, float]:
    n1, n0 = labels.count(1), labels.count(0)
    hits = sum(f and lab == 1 for f, lab in zip(flags, labels))
    wrong = sum(f and lab == 0 for f, lab in zip(flags, labels))
    return hits / max(n1, 1), wrong / max(n0, 1)


def threshold_for(cos: torch.Tensor, passed: list[bool], labels: list[int], near_misses: int) -> float:
    """The lowest threshold at which the guard and it serve no more than ``near_misses``."""
    scores = sorted((c for c, ok, lab in zip(cos.tolist(), passed, labels) if ok and lab == 0), reverse=True)
    if near_misses >= len(scores):
        return -1.0
    return scores[near_misses] + 1e-6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=384)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--high", type=float, default=0.95, help="cosine a shared pair is pulled to")
    parser.add_argument("--low", type=float, default=0.80, help="cosine a near-miss is pushed below")
    parser.add_argument("--apart", type=float, default=0.30, help="cosine unrelated prompts are pushed below")
    parser.add_argument("--keep", type=float, default=1e-6, help="weight of |A|^2: how near W stays to I")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    began = time.perf_counter()
    guard = LexicalNearMissVerifier()
    files = load(guard)
    from gpucache import TransformerEmbedder

    embedder = TransformerEmbedder(device="cpu")
    vectors = []
    for _, rows, _ in files:
        a = embedder.encode([guard.request(str(r["a"])) for r in rows]).float()
        b = embedder.encode([guard.request(str(r["b"])) for r in rows]).float()
        vectors.append((a, b))
    lines = [
        "# A learned projection on the pooled embedding, on tuning data",
        "",
        f"Command: `python3 bench/projection_study.py{f' --rank {args.rank}' if args.rank != 384 else ''}`; "
        f"{run_label(embedder)}; projection rank {args.rank}, {args.steps} steps, lr {args.lr}, "
        f"targets {args.high} / {args.low} / {args.apart}, keep {args.keep}.",
        "",
        "Each file held out in turn: the projection fitted on the other files, its threshold chosen "
        "there to serve as many near-misses (guard and threshold together) as today's cache does "
        f"at {DEFAULT_THRESHOLD}; the held-out file judged both ways.",
        "",
        "| held out | pairs | today: rewordings / near-misses | projected: rewordings / near-misses | "
        "projected threshold | today's embedding at as many near-misses as projected | "
        "the guard at any similarity |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for k, (name, rows, passed) in enumerate(files):
        train = [j for j in range(len(files)) if j != k]
        x = torch.cat([vectors[j][0] for j in train])
        y = torch.cat([vectors[j][1] for j in train])
        labels = [int(r["label"]) for j in train for r in files[j][1]]
        ok = [p for j in train for p in files[j][2]]
        model = fit(x, y, torch.tensor(labels), args)
        with torch.no_grad():
            today = (x * y).sum(-1)
            wrong_today = sum(f and lab == 0 for f, lab in zip(served(today, ok, DEFAULT_THRESHOLD), labels))
            projected = (model(x) * model(y)).sum(-1)
            t = threshold_for(projected, ok, labels, wrong_today)
            hx, hy = vectors[k]
            held = [int(r["label"]) for r in rows]
            before = rates(served((hx * hy).sum(-1), passed, DEFAULT_THRESHOLD), held)
            after = rates(served((model(hx) * model(hy)).sum(-1), passed, t), held)
            ceiling = rates(served((hx * hy).sum(-1), passed, -1.0), held)
            plain = (hx * hy).sum(-1)  # today's similarities, the threshold lowered instead
            wrong_after = round(after[1] * held.count(0))
            lowered = rates(served(plain, passed, threshold_for(plain, passed, held, wrong_after)), held)
        lines.append(
            f"| {name} | {len(rows)} | {before[0]:.1%} / {before[1]:.1%} | {after[0]:.1%} / {after[1]:.1%} "
            f"| {t:.3f} | {lowered[0]:.1%} / {lowered[1]:.1%} | {ceiling[0]:.1%} / {ceiling[1]:.1%} |"
        )
        print(lines[-1], flush=True)
    lines += ["", f"{time.perf_counter() - began:.0f} s."]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", "utf-8")


if __name__ == "__main__":
    main()
