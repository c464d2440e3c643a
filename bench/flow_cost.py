"""What the get-or-load machinery costs per call, apart from the embedder and the scan.

``aget_or_put`` on misses (an instant loader) and then on the same prompts again (exact hits),
in one process, with a 16-dimension embedder made of a hash: the time is the flow, its
drivers, the lookup's bookkeeping, the claims, the store and the thread hops, the parts a
change to them can slow. Run it for two trees in turn (``PYTHONPATH=<tree>``, alternating, a few
rounds) to compare them like with like; it prints one line and writes no report.

    python3 bench/flow_cost.py --calls 3000 --label here
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time

import torch

from gpucache import SemanticCache, StoreEverything, ThresholdOnly


class HashEmbedder:
    """Unit vectors from a prompt's SHA-256: deterministic, and nearly free."""

    name, dim, device = "sha256-16", 16, torch.device("cpu")

    def encode(self, texts: list[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros((0, self.dim))
        digests = [list(hashlib.sha256(t.encode()).digest()[: self.dim]) for t in texts]
        rows = [torch.tensor(d, dtype=torch.float32) - 127.5 for d in digests]
        return torch.nn.functional.normalize(torch.stack(rows), dim=1)


async def measure(calls: int) -> tuple[float, float]:
    """Microseconds per miss and per exact hit, each the mean over ``calls`` in a row."""
    cache = SemanticCache(
        HashEmbedder(),
        device="cpu",
        verifier=ThresholdOnly(),
        threshold=0.99,
        cache_policy=StoreEverything(),
        capacity=calls + 1000,
    )

    async def loader(prompt: str) -> str:
        return "an answer to " + prompt

    for i in range(200):  # the first calls start the worker threads
        await cache.aget_or_put(f"warming up {i}", loader)
    began = time.perf_counter()
    for i in range(calls):
        await cache.aget_or_put(f"question number {i}", loader)
    miss = (time.perf_counter() - began) / calls
    began = time.perf_counter()
    for i in range(calls):
        await cache.aget_or_put(f"question number {i}", loader)
    hit = (time.perf_counter() - began) / calls
    cache.close()
    return miss * 1e6, hit * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls of each kind")
    parser.add_argument("--label", default="this tree", help="what the line is of")
    args = parser.parse_args()
    miss, hit = asyncio.run(measure(args.calls))
    print(f"{args.label}: miss {miss:.1f} us, exact hit {hit:.1f} us ({args.calls} calls each, CPU, fp32)")


if __name__ == "__main__":
    main()
