"""Train the pair model and write the shipped weights:

    python -m gpucache.pairing.training --out gpucache/pairing/weights

From the packaged all-MiniLM-L6-v2 (model.build), on the pairs of pairs.py, with a fixed seed:
binary cross-entropy on a pair's logit, AdamW with a linear warm-up and decay, batches of pairs
of like length, the word embeddings frozen (they stay the packaged model's, so they are not
shipped). One thread count and one seed give the same weights on one machine; another machine's
float sums may differ in their last bits, which is why the card quotes its own figures and the
guard reads scores with a margin. The cut is not chosen here: bench/pair_tuning.py chooses it on
tuning files the model never learned from and writes it into the weights' JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from pathlib import Path

import torch

from gpucache.pairing.meta import META_FILE, NEVER, WEIGHTS_FILE
from gpucache.pairing.model import FROZEN, build, digest, ordered
from gpucache.pairing.training.pairs import HELD_OUT, Pair, training_pairs

VERSION = "1"
MAX_TOKENS = 256


def batches(pairs: list[Pair], tokenizer, size: int, rng: random.Random) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Indices in batches of pairs of like token length, the batches in a seeded order."""
    lengths = [
        len(tokenizer(*ordered(p.a, p.b), truncation=True, max_length=MAX_TOKENS)["input_ids"]) for p in pairs
    ]
    order = sorted(range(len(pairs)), key=lambda i: (lengths[i], rng.random()))
    out = [order[i : i + size] for i in range(0, len(order), size)]
    rng.shuffle(out)
    return out


def train(root: Path, out: Path, *, seed: int, epochs: float, batch: int, lr: float, minutes: float) -> dict:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    pairs = training_pairs(root, seed)
    tokenizer, model = build()
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    plan = batches(pairs, tokenizer, batch, rng)
    steps = max(1, int(len(plan) * epochs))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    warm = max(1, steps // 16)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm)))
    )
    model.train()
    started, step, seen, running = time.monotonic(), 0, 0, 0.0
    while step < steps:
        for indices in plan if step == 0 else rng.sample(plan, len(plan)):
            if step >= steps or time.monotonic() - started > minutes * 60:
                steps = step
                break
            chosen = [pairs[i] for i in indices]
            firsts, seconds = zip(*(ordered(p.a, p.b) for p in chosen))
            enc = tokenizer(
                list(firsts),
                list(seconds),
                padding=True,
                truncation=True,
                max_length=MAX_TOKENS,
                return_tensors="pt",
            )
            logits = model(**enc).logits[:, 0]
            target = torch.tensor([float(p.label) for p in chosen])
            weight = torch.tensor([p.weight for p in chosen])
            loss = (
                torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
                * weight
            ).sum() / weight.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            seen += len(chosen)
            running = 0.98 * running + 0.02 * float(loss.detach()) if step > 1 else float(loss.detach())
            if step % 50 == 0:
                print(
                    f"step {step}/{steps} pairs {seen} loss {running:.3f} {time.monotonic() - started:.0f}s",
                    flush=True,
                )
    model.eval()
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items() if k != FROZEN
    }
    save_file(state, str(out / WEIGHTS_FILE))
    meta = {
        "version": VERSION,
        "max_tokens": MAX_TOKENS,
        "floor": 875,  # until bench/pair_tuning.py --write chooses the design: the rules alone
        "cut": NEVER,
        "keep_cut": -NEVER,
        "margin": 0,
        "base_digest": digest(model.bert.embeddings.word_embeddings.weight),
        "seed": seed,
        "command": (
            f"python -m gpucache.pairing.training --seed {seed} --epochs {epochs} --batch {batch} "
            f"--lr {lr} --minutes {minutes} --out {out}"
        ),
        "pairs": len(pairs),
        "by_source": dict(sorted(Counter(p.source for p in pairs).items())),
        "steps": step,
        "pairs_seen": seen,
        "seconds": round(time.monotonic() - started),
        "threads": torch.get_num_threads(),
        "never_trained_on": [*HELD_OUT, "every exam"],
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m gpucache.pairing.training", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seed", type=int, default=20261207)
    parser.add_argument("--epochs", type=float, default=1.8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=8e-5)
    parser.add_argument("--minutes", type=float, default=55.0, help="stop after this long (default 55)")
    parser.add_argument(
        "--root", type=Path, default=Path("."), help="the repository (its data/ and ../shared/data)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    meta = train(
        args.root,
        args.out,
        seed=args.seed,
        epochs=args.epochs,
        batch=args.batch,
        lr=args.lr,
        minutes=args.minutes,
    )
    print(json.dumps({k: meta[k] for k in ("pairs", "by_source", "steps", "pairs_seen", "seconds")}))
