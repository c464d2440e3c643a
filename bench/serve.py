"""Serving benchmark: the proxy's overhead against calling the upstream directly, and hits per
second with lookups batched across requests against without.

    python3 bench/serve.py --out bench/reports/serve.md [--token-delay 0.002] [--seconds 10]

The load comes from wrk (Debian's package: ``apt-get install wrk``) where it is installed, which
keeps the load generator's own cost small on a small machine, and else from httpx.

Everything runs on 127.0.0.1: the stand-in upstream (gpucache/tools/upstream.py, answering after
``--token-delay`` seconds per word, so a miss costs what a small model would) and the proxy
(``gpucache serve``, the packaged model on this machine's device) each in a process of its own,
and the load from this one, bounded in requests and time.

- Latency: p50 and p99 of one request, at 1, 16 and 64 concurrent clients, for the upstream
  alone, a proxy miss (a new prompt each time), a proxy exact hit (a stored prompt asked again:
  a dictionary lookup) and a proxy semantic hit (a reworded prompt from the demo workload that
  the cache answers by meaning, so the embedder and the scan run every time); exact hits also
  at 256 clients.
- Throughput: semantic hits per second at 64 clients, with the lookup window at 2 ms (lookups
  that arrive together share one embedder batch and one scan) and at 0 (each alone), measured
  on two proxies started one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import httpx

CONCURRENCY = (1, 16, 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(command: list[str], url: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)  # the process is still starting (loading the model)
    process.kill()
    raise RuntimeError(f"{command} did not start: {process.stderr.read().decode() if process.stderr else ''}")


def proxy_command(up_port: int, *flags: str) -> list[str]:
    """``gpucache serve`` in front of the stand-in upstream on ``up_port``, quiet, with ``flags``."""
    return [sys.executable, "-m", "gpucache", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1",
            "--log-level", "warning", *flags]


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(60)


def workload() -> list[tuple[str, list[str]]]:
    """(a question's original prompt, its paraphrases) from the packaged demo workload."""
    text = resources.files("gpucache").joinpath("data/demo_workload.jsonl").read_text("utf-8")
    originals: dict[int, str] = {}
    paraphrases: dict[int, list[str]] = {}
    for line in text.splitlines():
        item = json.loads(line)
        if item["kind"] == "original":
            originals[item["group"]] = item["prompt"]
        elif item["kind"] == "paraphrase":
            paraphrases.setdefault(item["group"], []).append(item["prompt"])
    return [(originals[g], sorted(set(p))) for g, p in paraphrases.items() if g in originals]


def body(prompt: str) -> dict[str, object]:
    return {"model": "bench", "messages": [{"role": "user", "content": prompt}]}


async def timed_requests(url: str, prompts: list[str], clients: int, deadline: float) -> list[float]:
    """Each prompt once, ``clients`` at a time; the seconds each took."""
    seconds: list[float] = []
    queue = list(reversed(prompts))
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=clients)) as client:

        async def worker() -> None:
            while queue and time.monotonic() < deadline:
                prompt = queue.pop()
                started = time.perf_counter()
                response = await client.post(url, json=body(prompt))
                response.raise_for_status()
                seconds.append(time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(clients)))
    return seconds


WRK_SCRIPT = """
local bodies = {%s}
local i = 0
request = function()
  i = i + 1
  local body = bodies[(i - 1) %% #bodies + 1]
  if string.find(body, "UNIQUE", 1, true) then
    body = string.gsub(body, "UNIQUE", tostring(i) .. "-" .. tostring(math.random(1, 1000000000)))
  end
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %%d %%d %%f %%f %%f\\n", summary.requests,
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.timeout,
    summary.duration / 1e6, latency:percentile(50) / 1e6, latency:percentile(99) / 1e6))
end
"""


def wrk(url: str, prompts: list[str], clients: int, seconds: float) -> tuple[int, int, float, float, float]:
    """(requests, errors, seconds, p50, p99) of ``clients`` connections kept busy for ``seconds``
    by wrk, a load generator in C: on a 2-core machine a Python one takes a core of its own."""
    quoted = ", ".join(lua_string(json.dumps(body(p))) for p in prompts)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT % quoted)
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{clients}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "30s",
            "-s",
            script.name,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(script.name)
    line = next(row for row in out.splitlines() if row.startswith("RESULT"))
    n, errors, duration, p50, p99 = line.split()[1:]
    return int(n), int(errors), float(duration), float(p50), float(p99)


def lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def semantic_hits(proxy: str, items: list[tuple[str, list[str]]]) -> list[str]:
    """Store each question's first prompt, then keep the rewordings the proxy answers by
    meaning (its verifier refuses some: those would be misses, not hits)."""
    async with httpx.AsyncClient(timeout=60) as client:
        for first, _ in items:
            (await client.post(proxy, json=body(first))).raise_for_status()
        hits = []
        for _, rewordings in items:
            for prompt in rewordings:
                response = await client.post(proxy, json=body(prompt))
                if response.headers.get("x-gpucache") == "semantic":
                    hits.append(prompt)
    return hits


def measure(
    url: str, prompts: list[str], clients: int, args: argparse.Namespace
) -> tuple[int, float, float, float]:
    """(requests, p50 s, p99 s, requests per second) of ``clients`` concurrent clients: through
    wrk for ``--seconds`` where it is installed, else ``--requests`` through httpx. A prompt
    holding UNIQUE is made unique per request (a miss each time)."""
    if shutil.which("wrk"):
        n, errors, seconds, p50, p99 = wrk(url, prompts, clients, args.seconds)
        if errors:
            raise RuntimeError(f"{errors} of {n} requests to {url} failed")
        return n, p50, p99, n / seconds
    unique = [
        p.replace("UNIQUE", str(i)) for i, p in enumerate(prompts * (args.requests // len(prompts) + 1))
    ]
    started = time.perf_counter()
    seconds = asyncio.run(timed_requests(url, unique[: args.requests], clients, time.monotonic() + 120))
    elapsed = time.perf_counter() - started
    return len(seconds), percentile(seconds, 0.5), percentile(seconds, 0.99), len(seconds) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/reports/serve.md")
    parser.add_argument("--token-delay", type=float, default=0.002, help="upstream seconds per word")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one cell with wrk")
    parser.add_argument("--requests", type=int, default=256, help="requests per cell without wrk")
    args = parser.parse_args()

    up_port = free_port()
    upstream = start(
        [
            sys.executable,
            "-m",
            "gpucache.tools.upstream",
            "--port",
            str(up_port),
            "--token-delay",
            str(args.token_delay),
        ],
        f"http://127.0.0.1:{up_port}/v1/models",
    )
    items = workload()
    rows: list[tuple[str, int, int, float, float, float]] = []
    throughput: dict[str, float] = {}
    try:
        for window in ("2", "0"):
            port = free_port()
            proxy = start(
                proxy_command(up_port, "--port", str(port),
                              "--lookup-window-seconds", str(float(window) / 1000)),
                f"http://127.0.0.1:{port}/health",
            )
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            try:
                hits = asyncio.run(semantic_hits(url, items))
                repeats = [first for first, _ in items]  # stored above: exact repeats
                if window == "2":
                    direct = f"http://127.0.0.1:{up_port}/v1/chat/completions"
                    for clients in CONCURRENCY:
                        for label, target, prompts in (
                            ("upstream directly", direct, [f"direct {clients} UNIQUE: what is the sum?"]),
                            ("proxy, miss", url, [f"miss {clients} UNIQUE: what is the sum?"]),
                            ("proxy, exact hit", url, repeats),
                            ("proxy, semantic hit", url, hits),
                        ):
                            n, p50, p99, rate = measure(target, prompts, clients, args)
                            rows.append((label, clients, n, p50, p99, rate))
                    exact_rate = measure(url, repeats, 256, args)[3]
                throughput[window] = measure(url, hits, 64, args)[3]
            finally:
                stop(proxy)
    finally:
        stop(upstream)

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    info = subprocess.run([sys.executable, "-m", "gpucache", "info"], capture_output=True, text=True).stdout
    command = (
        f"python3 bench/serve.py --out {args.out} --token-delay {args.token_delay} --seconds {args.seconds}"
    )
    load = "wrk (one thread)" if shutil.which("wrk") else "httpx from Python"
    lines = [
        "# Serving: proxy overhead and batched lookups",
        "",
        f"Command: `{command}` (commit {commit}, {platform.machine()}, {os.cpu_count()} CPU threads,",
        f"Python {platform.python_version()}). The upstream answers after {args.token_delay} s per word",
        f"(7 words an answer); proxy, upstream and the load generator, {load}, share this machine.",
        f"{len(hits)} reworded demo prompts are answered by meaning and asked in turn for the hits.",
        "",
        "```",
        info.strip(),
        "```",
        "",
        "## Latency of one request (ms)",
        "",
        "| path | clients | requests | p50 | p99 | requests/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {label} | {clients} | {n} | {1000 * p50:.1f} | {1000 * p99:.1f} | {rate:.0f} |"
        for label, clients, n, p50, p99, rate in rows
    ]
    lines += ["", f"Exact hits at 256 clients: {exact_rate:.0f} requests/s."]
    ratio = throughput["2"] / throughput["0"]
    lines += [
        "",
        "## Semantic hits per second at 64 clients",
        "",
        "| lookups | hits/s |",
        "|---|---:|",
        f"| batched across requests (window 2 ms) | {throughput['2']:.0f} |",
        f"| one at a time (window 0) | {throughput['0']:.0f} |",
        "",
        f"Batching across requests: {ratio:.2f}x the hits per second.",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
