"""The async API never blocks its event loop: no await waits on a lock that a scan can hold.

One thread runs long scans over a large store, holding the cache's lock for each; meanwhile an
asyncio ticker on the loop keeps its period, while small async calls wait for that lock in
worker threads. The bound is derived from the scan itself: a loop that waited on the lock would
be late by about a whole scan, so the ticker's worst lateness must stay well under one.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import threading
import time

import torch

from gpucache import SemanticCache, StoreEverything, ThresholdOnly


class RandomEmbedder:
    """Seeded random unit vectors, one per text: fast to make in bulk, and distinct."""

    name = "random"
    dim = 384
    device = torch.device("cpu")

    def encode(self, texts):
        gen = torch.Generator().manual_seed(len(texts) * 7919 + len(texts[0]))
        return torch.nn.functional.normalize(torch.randn(len(texts), self.dim, generator=gen), dim=1)


def large_cache(entries: int) -> SemanticCache:
    cache = SemanticCache(
        RandomEmbedder(),
        device="cpu",
        verifier=ThresholdOnly(),
        cache_policy=StoreEverything(),
        capacity=entries,
    )
    cache.warm((f"stored prompt {i}", "answer") for i in range(entries))
    return cache


def entries_for_a_scan_of(seconds: float, batch: list[str]) -> int:
    """How many entries make one scan of ``batch`` last about ``seconds`` on this machine,
    from a measured scan of a small store: the scan must be long beside the ticker's period
    on every CPU, yet a CPU whose batch path is slow must not turn this test into minutes."""
    probe_rows = 16_384
    probe = large_cache(probe_rows)
    probe.get_all(batch)  # the first scan of the shape settles its path
    timings = []
    for _ in range(2):
        started = time.perf_counter()
        probe.get_all(batch)
        timings.append(time.perf_counter() - started)
    per_row = min(timings) / probe_rows
    return max(probe_rows, min(200_000, int(seconds / per_row)))


def test_a_long_scan_in_another_thread_never_stalls_the_loop():
    batch = [f"scanned prompt {i}" for i in range(512)]
    cache = large_cache(entries_for_a_scan_of(0.4, batch))
    three_scans, stop = threading.Event(), threading.Event()
    scan_seconds: list[float] = []

    def scanner() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            cache.get_all(batch)  # holds the cache's lock for the whole scan
            scan_seconds.append(time.perf_counter() - started)
            if len(scan_seconds) == 3:
                three_scans.set()

    async def main() -> tuple[list[float], int]:
        period = 0.005
        lateness: list[float] = []
        answered = 0

        async def ticker() -> None:
            while not stop.is_set():
                expected = time.perf_counter() + period
                await asyncio.sleep(period)  # the ticker's own period, not a synchronisation
                lateness.append(time.perf_counter() - expected)

        async def small_calls() -> None:
            nonlocal answered
            while not stop.is_set():
                await cache.aget_all(["a small lookup"])  # waits for the lock in a worker
                # a repeat tries the lock without waiting, then goes the same way
                assert (await cache.aget("stored prompt 0")).exact
                answered += 1

        tick = asyncio.create_task(ticker())
        calls = asyncio.create_task(small_calls())
        await asyncio.to_thread(three_scans.wait)  # three whole scans ran while the loop was busy
        stop.set()
        await asyncio.gather(tick, calls)
        return lateness, answered

    # The garbage collector's full pass stops every thread while it walks the objects it tracks
    # (with 126,000 entries and torch loaded, 0.10 to 0.15 s on a 2-core CPU, measured with
    # gc.callbacks): a stall of its own, lock or no lock, which failed this test about one run in
    # five under load. It is kept out of this measurement so that a late tick here means what the
    # test is about, the loop waiting on the lock; the collector's pauses are another problem.
    gc.collect()
    gc.disable()
    thread = threading.Thread(target=scanner)
    thread.start()
    try:
        lateness, answered = asyncio.run(main())
    finally:
        stop.set()
        thread.join()
        gc.enable()
    scan = statistics.median(scan_seconds)
    assert answered >= 1  # the small calls went through between scans
    assert len(lateness) >= 10
    assert max(lateness) < scan / 4, (max(lateness), scan)
