"""How the benchmark times a call: after a warm-up, synchronized, and several calls compared in
blocks taken close together (``timed_together``), so that a shared machine's drift falls on
every engine alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeat: int) -> tuple[float, float]:
    """Median and spread (max - min) seconds of ``fn`` over ``repeat`` runs, after a warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), max(times) - min(times)


BLOCK_SECONDS = 0.2


BLOCK_RUNS = 50


def timed_together(
    fns: Sequence[Callable[[], object]],
    device: torch.device,
    repeat: int,
    clock: Callable[[], float] = time.perf_counter,
    counts: list[int] | None = None,
) -> list[tuple[float, float]]:
    """``timed`` for several functions compared with each other: each is timed in a block
    right after the others (seconds apart, where timing all N and Q of one engine before the
    next had let minutes of a shared machine's drift decide the comparison), in forward order
    then in reverse order, so a load that rises or falls through the measurement falls on
    every engine alike. Each block starts with an untimed run: the engines use different
    thread pools (torch's OpenMP, numpy's BLAS, FAISS's OpenMP), and a pool that has just
    worked keeps spinning on the cores for a while (interleaved run by run, FAISS's fp32
    Q = 64 search took 29 ms instead of 4).
    """
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for runs, indices in (((repeat + 1) // 2, order), (repeat // 2, order[::-1])):
        if runs == 0:
            continue
        for i in indices:
            fns[i]()  # settles the thread pools this engine uses
            sync(device)
            spent, done = 0.0, 0
            # fast cases run until the block has taken BLOCK_SECONDS (up to BLOCK_RUNS runs):
            # a median of 3 runs of a 1 ms search is mostly the machine's noise
            while done < runs or (spent < BLOCK_SECONDS and done < BLOCK_RUNS):
                start = clock()
                fns[i]()
                sync(device)
                times[i].append(clock() - start)
                spent += times[i][-1]
                done += 1
    if counts is not None:  # how many timed calls each median is of
        counts[:] = [len(t) for t in times]
    return [(statistics.median(t), max(t) - min(t)) for t in times]
