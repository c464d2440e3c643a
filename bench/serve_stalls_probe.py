"""``gpucache serve`` with instruments, for ``bench/serve_stalls.py``: what holds exact hits.

It records, into the JSON file named by ``STALLS_OUT`` (on exit and on SIGUSR1): the event
loop's lag (a task that sleeps 5 ms, and how late it wakes); the exact tier's tries (its lock
free at once, or busy) and its waits for the lock in its own thread; each hold of the cache's
lock past 5 ms, with where it was taken; the time spent in the entry table's store and the
index's writes; and each gap past 15 ms in which a thread of its own, waking every millisecond,
could not run, with every other thread's stack at its end (what held the GIL, or the cores).
A diagnostic: it replaces private parts of the cache (its lock, some methods) while it runs.

    STALLS_OUT=stalls.json python3 bench/serve_stalls_probe.py serve --upstream URL ...
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

OUT = os.environ["STALLS_OUT"]
RECORD: dict[str, Any] = {"lag": [], "busy": 0, "free": 0, "waits": [], "gaps": [], "holds": [], "calls": {}}


def frames_of_others() -> dict[str, list[str]]:
    """Every other thread's innermost frames, as file:line:function."""
    frames = sys._current_frames()
    found = {}
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if frame is None or thread is threading.current_thread():
            continue
        stack = []
        while frame is not None and len(stack) < 6:
            code = frame.f_code
            stack.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno}:{code.co_name}")
            frame = frame.f_back
        found[thread.name] = stack
    return found


def watch_gaps() -> None:
    last = time.perf_counter()
    while True:
        time.sleep(0.001)
        now = time.perf_counter()
        if now - last > 0.015:
            RECORD["gaps"].append((time.time(), round((now - last) * 1000, 1), frames_of_others()))
        last = now


class TimedLock:
    """A re-entrant lock that records each outermost hold past 5 ms and where it was taken."""

    def __init__(self) -> None:
        self.inner, self.local = threading.RLock(), threading.local()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        taken = self.inner.acquire(blocking, timeout)
        if taken:
            depth = getattr(self.local, "depth", 0)
            if depth == 0:
                self.local.began = time.perf_counter()
                self.local.where = [
                    f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}"
                    for f in traceback.extract_stack(limit=5)
                ][:-1]
            self.local.depth = depth + 1
        return taken

    def release(self) -> None:
        self.local.depth -= 1
        if self.local.depth == 0:
            held = time.perf_counter() - self.local.began
            if held > 0.005:
                RECORD["holds"].append((time.time(), round(held * 1000, 1), self.local.where))
        self.inner.release()

    def __enter__(self) -> TimedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def timed(owner: Any, name: str, label: str) -> None:
    """``owner.name`` wrapped: its calls, total and longest milliseconds, and calls past 5 ms."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            ms = (time.perf_counter() - began) * 1000
            n, total, longest, over = RECORD["calls"].get(label, (0, 0.0, 0.0, 0))
            RECORD["calls"][label] = (n + 1, total + ms, max(longest, ms), over + (ms > 5))

    setattr(owner, name, wrapper)


def instrument() -> None:
    from gpucache.cache import core, entries, onloop
    from gpucache.index import codecs, refine, store

    exact = onloop.LoopLookups.exact

    def exact_counted(self: Any, request: Any, wait: bool) -> Any:
        began = time.perf_counter()
        found = exact(self, request, wait)
        if wait:
            RECORD["waits"].append(round((time.perf_counter() - began) * 1000, 2))
        elif isinstance(found, onloop.LockBusy):
            RECORD["busy"] += 1
        else:
            RECORD["free"] += 1
        return found

    onloop.LoopLookups.exact = exact_counted  # type: ignore[method-assign]
    looked = onloop.LoopLookups.looked
    probes: list[asyncio.Task[None]] = []

    async def lag() -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(0.005)
            RECORD["lag"].append(round((time.perf_counter() - began - 0.005) * 1000, 2))

    async def looked_probed(self: Any, request: Any) -> Any:
        if not probes:  # the first lookup is on the loop: the lag probe starts there
            probes.append(asyncio.get_running_loop().create_task(lag()))
        return await looked(self, request)

    onloop.LoopLookups.looked = looked_probed  # type: ignore[method-assign]
    init = core.CacheCore.__init__

    def init_timed(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.lock = self.lookup.lock = TimedLock()

    core.CacheCore.__init__ = init_timed  # type: ignore[method-assign]
    timed(entries.EntryTable, "store", "table.store")
    timed(store.ExactScanStore, "add", "index.add")
    timed(codecs.Int8BlockCodec, "write", "Int8BlockCodec.write")
    timed(refine.FullCopy, "write", "FullCopy.write")


def dump(*_: object) -> None:
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(RECORD, f)


if __name__ == "__main__":
    threading.Thread(target=watch_gaps, daemon=True, name="stalls-watch").start()
    instrument()
    atexit.register(dump)
    signal.signal(signal.SIGUSR1, dump)
    from gpucache.cli import main

    sys.exit(main(sys.argv[1:]))
