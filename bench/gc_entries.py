"""What a full garbage collection costs per entry the cache holds: entries kept as objects of a
class against entries kept as plain tuples (what ``EntryTable`` keeps: cache/entries.py), each in
an ``OrderedDict`` by key and a dict by row as the table keeps them, after the start-up heap is
frozen as ``gpucache serve`` freezes it (serve/heap.py). A full collection holds the GIL: every
request waits for it.

    python3 bench/gc_entries.py --entries 300000
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class AsObject:
    """An entry as an object of a class (how the table kept them before)."""

    key: bytes
    scope: str
    prompt: str
    response: str
    row: int
    stored_at: float = -math.inf
    size: int = 0


def full_collection_ms(rounds: int = 5) -> float:
    gc.collect()
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - began)
    return 1000 * min(times)


def held(n: int, make: Any) -> tuple[OrderedDict[bytes, Any], dict[int, Any]]:
    by_key: OrderedDict[bytes, Any] = OrderedDict()
    by_row: dict[int, Any] = {}
    for row in range(n):
        key = os.urandom(16)
        entry = make(
            key, "tenant/scope", f"prompt number {row}", f"the answer to prompt {row}", row, 1.0, 100
        )
        by_key[key] = by_row[row] = entry
    return by_key, by_row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=300_000)
    args = parser.parse_args()
    import torch  # noqa: F401 - the engine a cache loads, in the heap that is frozen

    gc.collect()
    gc.freeze()
    print(f"a full collection, nothing held: {full_collection_ms():.1f} ms")
    for label, make in (("objects", AsObject), ("tuples", lambda *fields: tuple(fields))):
        tables = held(args.entries, make)
        print(f"{args.entries:,} entries as {label}: a full collection {full_collection_ms():.1f} ms")
        del tables


if __name__ == "__main__":
    main()
