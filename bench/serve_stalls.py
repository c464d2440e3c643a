"""What holds an exact hit under load: ``gpucache serve`` run under ``serve_stalls_probe.py``.

Two loads, each beside one tenant's exact hits:

    misses   8 clients of exact hits and 32 of new prompts at once (wrk, as bench/serve.py's
             "exact hits beside misses that saturate the embedder"), for ``--seconds``
    bodies   one client's exact hits while 4 clients with keys of their own send 7.8 MB
             conversations whose bulk is an earlier turn (the shape of #49's finding 9)

It prints the hits' and the other load's latency, the event loop's lag, the exact tier's waits
for the cache's lock, the lock's long holds by where they were taken, the store's parts, and
the longest gaps in which a thread could not run, with what the other threads were doing.

    python3 bench/serve_stalls.py --load misses --seconds 10
    python3 bench/serve_stalls.py --load bodies --seconds 15
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve as bench_serve  # noqa: E402

PROBE = Path(__file__).resolve().parent / "serve_stalls_probe.py"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def signal_dump(pid: int) -> None:
    os.kill(pid, signal.SIGUSR1)
    time.sleep(0.5)  # the probe writes its record from a signal handler: let it finish


def misses_load(url: str, pid: int, seconds: float) -> tuple[float, float]:
    repeats = [first for first, _ in bench_serve.workload()]
    bench_serve.prime(url, repeats)
    signal_dump(pid)
    misses = bench_serve.start_wrk(url, ["mixed UNIQUE: what is the sum?"], 32, seconds)
    began = time.time()
    hits = bench_serve.finish_wrk(bench_serve.start_wrk(url, repeats, 8, seconds, "exact"))
    missed = bench_serve.finish_wrk(misses)
    ended = time.time()
    print(
        f"exact hits (8 clients): {hits.ok} in {hits.seconds:.1f} s, p50 {1000 * hits.p50:.1f} ms, "
        f"p99 {1000 * hits.p99:.1f} ms"
    )
    print(
        f"misses (32 clients): {missed.ok} in {missed.seconds:.1f} s, p50 {1000 * missed.p50:.1f} ms, "
        f"p99 {1000 * missed.p99:.1f} ms"
    )
    return began, ended


def bodies_load(url: str, pid: int, seconds: float) -> tuple[float, float]:
    own = {"authorization": "Bearer sk-tenant-b", "content-type": "application/json"}
    hit = json.dumps(
        {"model": "smol", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    )
    bulk = ("lorem ipsum dolor " * 460_000)[: 7_800_000 - 300]
    with httpx.Client(timeout=60) as client:
        client.post(url, content=hit, headers=own)
        alone = []
        for _ in range(200):
            began = time.perf_counter()
            client.post(url, content=hit, headers=own)
            alone.append(time.perf_counter() - began)
        signal_dump(pid)
        stop, answered = threading.Event(), Counter[int]()

        def send(i: int) -> None:
            body = json.dumps(
                {
                    "model": "smol",
                    "messages": [
                        {"role": "user", "content": bulk},
                        {"role": "assistant", "content": "ok"},
                        {"role": "user", "content": f"Summarise it please {i}"},
                    ],
                }
            ).encode()
            headers = {"authorization": f"Bearer sk-sender-{i}", "content-type": "application/json"}
            with httpx.Client(timeout=120) as sender:
                while not stop.is_set():
                    answered[sender.post(url, content=body, headers=headers).status_code] += 1

        senders = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for thread in senders:
            thread.start()
        time.sleep(1)
        beside, began_at = [], time.time()
        while time.time() - began_at < seconds:
            began = time.perf_counter()
            client.post(url, content=hit, headers=own)
            beside.append(time.perf_counter() - began)
        ended = time.time()
        stop.set()
        for thread in senders:
            thread.join(120)
    print(
        f"exact hits alone: p50 {1000 * percentile(alone, 0.5):.1f} ms, "
        f"p99 {1000 * percentile(alone, 0.99):.1f} ms"
    )
    print(
        f"beside the senders: {len(beside)} hits, p50 {1000 * percentile(beside, 0.5):.1f} ms, "
        f"p99 {1000 * percentile(beside, 0.99):.1f} ms; the senders' answers {dict(answered)}"
    )
    return began_at, ended


def summary(record: dict[str, Any], began: float, ended: float) -> None:
    lag = record["lag"]
    print(
        f"event loop lag: p50 {percentile(lag, 0.5):.2f} ms, p99 {percentile(lag, 0.99):.2f} ms, "
        f"max {max(lag, default=float('nan')):.2f} ms"
    )
    waits = record["waits"]
    print(
        f"exact tier: lock free at once {record['free']}, busy {record['busy']}; waits for it in its "
        f"thread {len(waits)}, p99 {percentile(waits, 0.99):.1f} ms, max {max(waits, default=0):.1f} ms"
    )
    holds = [h for h in record["holds"] if began <= h[0] <= ended]
    print(f"the cache's lock held past 5 ms: {len(holds)} times, {sum(h[1] for h in holds):.0f} ms in all")
    by_site: Counter[str] = Counter()
    for _, ms, where in holds:
        by_site[" < ".join(reversed(where[-3:]))] += ms
    for site, ms in by_site.most_common(5):
        print(f"   {ms:8.1f} ms  {site}")
    for label, (n, total, longest, over) in sorted(record["calls"].items(), key=lambda kv: -kv[1][1]):
        print(f"{label}: {n} calls, {total:.0f} ms in all, longest {longest:.1f} ms, {over} past 5 ms")
    gaps = [g for g in record["gaps"] if began <= g[0] <= ended]
    print(
        f"gaps past 15 ms in which a thread could not run: {len(gaps)}, longest "
        f"{sorted(g[1] for g in gaps)[-5:]}"
    )
    doing: Counter[str] = Counter()
    for _, ms, threads in gaps:
        for name, stack in threads.items():
            if stack and not stack[0].startswith(("thread.py", "threading.py", "runners.py", "selectors")):
                doing[f"{name.rsplit('_', 1)[0]}: {' < '.join(stack[:3])}"] += ms
    for what, ms in doing.most_common(6):
        print(f"   {ms:8.1f} ms  {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", choices=("misses", "bodies"), default="misses")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="gpucache-stalls-")) / "record.json"
    up_port, port = bench_serve.free_port(), bench_serve.free_port()
    upstream = bench_serve.start(
        [sys.executable, str(bench_serve.STANDIN), "--port", str(up_port), "--token-delay", "0.002"],
        f"http://127.0.0.1:{up_port}/v1/models",
    )
    command = bench_serve.proxy_command(up_port, "--port", str(port))
    command[1:3] = [str(PROBE)]  # the probe in place of "-m gpucache"
    os.environ["STALLS_OUT"] = str(out)
    proxy = bench_serve.start(command, f"http://127.0.0.1:{port}/health")
    try:
        load = misses_load if args.load == "misses" else bodies_load
        began, ended = load(f"http://127.0.0.1:{port}/v1/chat/completions", proxy.pid, args.seconds)
        signal_dump(proxy.pid)
    finally:
        bench_serve.stop(proxy)
        bench_serve.stop(upstream)
    summary(json.loads(out.read_text()), began, ended)


if __name__ == "__main__":
    main()
