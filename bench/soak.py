"""Soak: replay a long stream of mixed operations through a bounded cache and watch memory.

A cache in front of real traffic runs for weeks. This replays >= 1M operations (gets, puts,
get_or_put, batched get_or_put_all, invalidations) over a vocabulary far larger than the
capacity, so the store fills, evicts and expires all the time, and samples the process RSS,
device memory (CUDA) and throughput as it goes. Memory must plateau once the store is full.

The embedder is a seeded hashing embedder (bag of hashed words, projected to 384 dims), not the
transformer: this measures the cache's own memory and bookkeeping, not the model's speed. The
workload is seeded; the numbers are what this machine measured.

    python bench/soak.py --ops 1000000 --capacity 20000 --out bench/reports/soak.md
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import time
from pathlib import Path

import torch
from provenance import run_label  # noqa: E402

from gpucache import SemanticCache, StoreEverything, ThresholdOnly


class HashingEmbedder:
    """Deterministic, cheap embeddings: each word picks a row of a fixed random matrix."""

    name = "hashing-bench"

    def __init__(self, dim: int = 384, vocab: int = 65536, device: str = "cpu") -> None:
        gen = torch.Generator().manual_seed(0)
        self._table = torch.nn.functional.normalize(torch.randn(vocab, dim, generator=gen), dim=1)
        self._table = self._table.to(device)
        self._vocab = vocab

    @property
    def dim(self) -> int:
        return int(self._table.shape[1])

    @property
    def device(self) -> torch.device:
        return self._table.device

    def encode(self, texts):  # type: ignore[no-untyped-def]
        ids, offsets = [], []
        for text in texts:
            offsets.append(len(ids))
            for word in text.split():
                h = hashlib.blake2b(word.encode(), digest_size=4).digest()
                ids.append(int.from_bytes(h, "little") % self._vocab)
        bag = torch.nn.functional.embedding_bag(
            torch.tensor(ids, dtype=torch.int64, device=self.device),
            self._table,
            torch.tensor(offsets, dtype=torch.int64, device=self.device),
            mode="sum",
        )
        return torch.nn.functional.normalize(bag, dim=1)


def rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # not Linux: peak RSS instead
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--capacity", type=int, default=20_000)
    parser.add_argument("--vocab", type=int, default=2_000_000, help="distinct prompts")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--out", default="bench/reports/soak.md")
    args = parser.parse_args()

    rng = random.Random(42)
    cache = SemanticCache(
        HashingEmbedder(device="cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu"),
        device=args.device,
        capacity=args.capacity,
        ttl=600.0,
        threshold=0.95,
        verifier=ThresholdOnly(),
        cache_policy=StoreEverything(),
    )
    clock = [0.0]
    cache.timer = lambda: clock[0]  # simulated time: 1 ms per operation, so TTLs expire

    def prompt() -> str:
        # Zipf-like popularity: a few prompts are hot, most are asked once
        n = int(args.vocab ** rng.random())
        return f"question {n} about topic {n % 97} and item {n % 1013}"

    samples = []
    done = 0
    step = max(1, args.ops // args.samples)
    started = time.perf_counter()
    last_time, last_done = started, 0
    while done < args.ops:
        op = rng.random()
        if op < 0.5:
            cache.get_or_put(prompt(), lambda p: "answer " + p)
            done += 1
        elif op < 0.7:
            cache.get(prompt())
            done += 1
        elif op < 0.8:
            cache.put(prompt(), "put answer")
            done += 1
        elif op < 0.98:
            batch = [prompt() for _ in range(16)]
            cache.get_or_put_all(batch, lambda ms: ["batch answer"] * len(ms))
            done += 16
        else:
            cache.invalidate(prompt())
            done += 1
        clock[0] += 0.001
        if done - last_done >= step or done >= args.ops:
            now = time.perf_counter()
            stats = cache.stats()
            samples.append(
                {
                    "ops": done,
                    "seconds": round(now - started, 2),
                    "ops_per_s": round((done - last_done) / (now - last_time)),
                    "rss_mib": round(rss_mib(), 1),
                    "device_mib": round(torch.cuda.memory_allocated() / 2**20, 1)
                    if torch.cuda.is_available()
                    else None,
                    "entries": stats.entries,
                    "store_mib": round(cache.store.nbytes / 2**20, 1),
                    "evictions": stats.evictions,
                    "expirations": stats.expirations,
                    "hit_rate": round(stats.hit_rate, 3),
                }
            )
            print(json.dumps(samples[-1]), flush=True)
            last_time, last_done = now, done

    first_full = next((s for s in samples if s["entries"] >= 0.95 * args.capacity), samples[-1])
    growth = samples[-1]["rss_mib"] - first_full["rss_mib"]
    lines = [
        "# Soak",
        "",
        f"`python bench/soak.py --ops {args.ops} --capacity {args.capacity} --out {args.out}`",
        "",
        f"{run_label()}; device {cache.device}. Hashing embedder (not the transformer); simulated "
        "clock, 1 ms per operation, TTL 600 s.",
        "",
        f"RSS once the store was full ({first_full['ops']} ops): {first_full['rss_mib']} MiB; at "
        f"the end ({samples[-1]['ops']} ops): {samples[-1]['rss_mib']} MiB; growth "
        f"{growth:+.1f} MiB.",
        "",
        "| ops | seconds | ops/s | RSS MiB | device MiB | entries | store MiB | evictions | "
        "expirations | hit rate |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in samples:
        lines.append(
            f"| {s['ops']} | {s['seconds']} | {s['ops_per_s']} | {s['rss_mib']} | "
            f"{s['device_mib'] if s['device_mib'] is not None else '-'} | {s['entries']} | "
            f"{s['store_mib']} | {s['evictions']} | {s['expirations']} | {s['hit_rate']} |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
