"""The objects a server starts with are frozen out of Python's full garbage collections.

Why: a server answers exact repeats on its event loop, and what stalled that loop while misses
saturated the embedder was not the embedder's threads taking the cores but the collector. By
the time it serves, the process holds hundreds of thousands of container objects it keeps for
its whole life (torch, transformers and the model's modules, the tokenizer, the guard's rules,
the imports), and every full (generation 2) collection walks all of them with the GIL held: a
large part of a second on a small CPU, while the loop and every request in flight wait. Under a
stream of misses (each leaves survivors behind: its entry, its response) a full collection
comes every few seconds, and those pauses were most of the exact hits' p99 beside saturating
misses and all of the loop's long stalls (the figures: the commit that made this module).

``gc.freeze()`` after start-up (and one collection first, so no garbage is frozen) moves those
objects to the permanent generation, which collections never walk: a full collection then
walks only what was made while serving, and the loop's long stalls under the same load are
gone. Frozen objects are still freed by reference counting; only a cycle
among them would outlive its last use, and what a server holds from start-up lives as long as
the server anyway. Objects made while serving (the entries) are collected as before, a full
collection coming only once the survivors since the last one have grown by a quarter
(CPython's own rule), so its cost grows with the entries stored, not with the libraries loaded.

How it was chosen (issue #39): the loop's lag (a callback scheduled 5 ms ahead, how late it
runs) and the exact hits' latency at 8 connections beside 32 of misses, through HTTP, with and
without each candidate. Capping torch's threads below the cores, or running the embedder's
threads at a lower priority, changed neither (within the run-to-run spread): the loop is held
up by what holds the GIL (a collection; the stores and scans that hold the cache's lock while
the GIL is handed around), not by a lack of cores. Freezing halved the hits' p99 and removed
the loop's long stalls.

The library is left as it is: a ``SemanticCache`` in someone's program lives with that
program's collector. Only the server freezes, in its lifespan, and thaws at shutdown, so an app
served inside another process (as the tests do) leaves that process's collector as it was;
where several are served in one process, the last to stop thaws.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass

_lock = threading.Lock()  # start-up and shutdown only: never taken while a request is served
_servers = 0  # servers in this process that froze the heap and have not stopped


@dataclass(frozen=True)
class Frozen:
    """What a server's start-up froze: ``objects`` in the permanent generation."""

    objects: int


def freeze() -> Frozen:
    """Collect once, then freeze every object alive: call when start-up is done."""
    global _servers
    with _lock:
        gc.collect()
        gc.freeze()
        _servers += 1
        return Frozen(gc.get_freeze_count())


def thaw(frozen: Frozen) -> None:
    """A server that froze has stopped: where it was the last, the objects go back to the
    collector's oldest generation."""
    global _servers
    with _lock:
        _servers -= 1
        if _servers == 0:
            gc.unfreeze()
