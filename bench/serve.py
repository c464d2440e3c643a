"""Serving benchmark: the proxy's overhead against calling the upstream directly, exact
repeats at every load, overload, warming up under load, and batched lookups.

    python3 bench/serve.py --out bench/reports/serve.md [--token-delay 0.002] [--seconds 10]

The load comes from wrk (Debian's package: ``apt-get install wrk``), which keeps the load
generator's own cost small on a small machine; its script checks every answer's
``x-gpucache`` header, so a cell counts only the answers of the tier it names.

Everything runs on 127.0.0.1: the stand-in upstream (tests/standin_upstream.py, answering after
``--token-delay`` seconds per word, so a miss costs what a small model would) and the proxy
(``gpucache serve`` with its defaults, the packaged model on this machine's device) each in a
process of its own, and the load from this one, bounded in requests and time.

- Latency: p50 and p99 at 1, 16 and 64 concurrent clients, for the upstream alone, a proxy miss
  (a new prompt each time), an exact hit (a stored prompt asked again) and a semantic hit (a
  reworded demo prompt the cache answers by meaning); exact hits also at 256 clients.
- Exact hits at 8 clients while 32 clients of misses keep the embedder saturated.
- A miss's own overhead at one client (``x-gpucache-overhead-ms``), and the embedder's and
  the scan's part of it (/metrics).
- Warming up: a proxy started empty, 200 clients, 60% repeats: how many repeats after the
  first 10 seconds were served from the cache, and how many requests failed.
- Throughput: semantic hits per second at 64 clients, with the lookup window at 2 ms and at 0.
- The peer: LiteLLM's proxy with its local exact cache (bench/serve_peer.py) in front of the same
  upstream, exact hits at 1, 16, 64 and 256 clients.
- ``--before``: an earlier report's cells beside this run's (bench/serve_compare.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx
import serve_compare
import serve_peer
from provenance import run_label  # noqa: E402

# the stand-in model server, test support (an OpenAI-compatible upstream that answers at once)
STANDIN = Path(__file__).resolve().parents[1] / "tests" / "standin_upstream.py"

CONCURRENCY = (1, 16, 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(command: list[str], url: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # stderr to a file, never a pipe nobody reads: a server logging under load would fill the
    # pipe and stall on its next write
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)  # the process is still starting (loading the model)
    process.kill()
    log.seek(0)
    raise RuntimeError(f"{command} did not start: {log.read().decode(errors='replace')}")


def proxy_command(up_port: int, *flags: str) -> list[str]:
    """``gpucache serve`` in front of the stand-in upstream on ``up_port``, quiet, with ``flags``."""
    return [
        sys.executable,
        "-m",
        "gpucache",
        "serve",
        "--upstream",
        f"http://127.0.0.1:{up_port}/v1",
        "--log-level",
        "warning",
        "--overhead-header",  # the benchmark reads the proxy's own time from it
        *flags,
    ]


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(90)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


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


# Every client sends a key, as a deployed proxy requires (keyless requests are refused by
# default); the stand-in upstream accepts any key, so each is checked once (auth_ttl) and hits
# pay for the check's lookup only.
KEY = "sk-bench"
HEADERS = {"authorization": f"Bearer {KEY}"}


def body(prompt: str) -> dict[str, object]:
    return {"model": "bench", "messages": [{"role": "user", "content": prompt}]}


WRK_SCRIPT = """
local bodies = {%s}
local expect = "%s"
local warm = %d
local i = 0
ok, wrong, late, late_hit = 0, 0, 0, 0
local begun = os.time()
local threads = {}
setup = function(thread) table.insert(threads, thread) end
request = function()
  i = i + 1
  local body = bodies[(i - 1) %% #bodies + 1]
  if string.find(body, "UNIQUE", 1, true) then
    body = string.gsub(body, "UNIQUE", tostring(i) .. "-" .. tostring(math.random(1, 1000000000)))
  end
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer %s"}
  return wrk.format("POST", nil, headers, body)
end
response = function(status, headers, body)
  -- LiteLLM sets x-litellm-cache-key only on an answer from its cache: an exact hit
  local tier = headers["x-gpucache"] or (headers["x-litellm-cache-key"] and "exact") or "none"
  if status == 200 and (expect == "" or tier == expect) then ok = ok + 1 else wrong = wrong + 1 end
  if string.find(body, "REPEAT", 1, true) and os.time() - begun >= warm then
    late = late + 1
    if tier == "exact" or tier == "semantic" then late_hit = late_hit + 1 end
  end
end
done = function(summary, latency, requests)
  local t = threads[1]
  io.write(string.format("RESULT %%d %%d %%f %%f %%f %%d %%d %%d %%d\\n", summary.requests,
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.timeout,
    summary.duration / 1e6, latency:percentile(50) / 1e6, latency:percentile(99) / 1e6,
    t:get("ok"), t:get("wrong"), t:get("late"), t:get("late_hit")))
end
"""


@dataclass
class Cell:
    """What wrk measured, and what the answers said they were: ``ok`` answers were 200s from
    the expected tier (the ``x-gpucache`` header), ``wrong`` were not (a timed-out lookup
    that went upstream is a miss, not a hit); ``late`` repeats asked after the warm-up, of
    which ``late_hit`` were served from the cache."""

    requests: int
    errors: int
    seconds: float
    p50: float
    p99: float
    ok: int
    wrong: int
    late: int
    late_hit: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def start_wrk(
    url: str,
    prompts: list[str],
    clients: int,
    seconds: float,
    expect: str = "",
    warm: int = 0,
    key: str = KEY,
) -> tuple[subprocess.Popen[str], str]:
    """wrk, a load generator in C (on a 2-core machine a Python one takes a core of its own),
    keeping ``clients`` connections busy for ``seconds``, each request with ``key``, and checking
    each answer's tier."""
    quoted = ", ".join(lua_string(json.dumps(body(p))) for p in prompts)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT % (quoted, expect, warm, key))
    command = [
        "wrk",
        "-t1",
        f"-c{clients}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "30s",
        "-s",
        script.name,
        url,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), script.name


def finish_wrk(started: tuple[subprocess.Popen[str], str]) -> Cell:
    process, script = started
    out, err = process.communicate()
    os.unlink(script)
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed: {err}")
    line = next(row for row in out.splitlines() if row.startswith("RESULT"))
    n, errors, duration, p50, p99, ok, wrong, late, late_hit = line.split()[1:]
    return Cell(
        int(n),
        int(errors),
        float(duration),
        float(p50),
        float(p99),
        int(ok),
        int(wrong),
        int(late),
        int(late_hit),
    )


def wrk(url: str, prompts: list[str], clients: int, seconds: float, expect: str = "", warm: int = 0) -> Cell:
    return finish_wrk(start_wrk(url, prompts, clients, seconds, expect, warm))


def lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def semantic_hits(proxy: str, items: list[tuple[str, list[str]]]) -> list[str]:
    """Store each question's first prompt, then keep the rewordings the proxy answers by
    meaning (its verifier refuses some: those would be misses, not hits)."""
    async with httpx.AsyncClient(timeout=60, headers=HEADERS) as client:
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
    url: str,
    prompts: list[str],
    clients: int,
    args: argparse.Namespace,
    expect: str = "",
    errors_allowed: bool = False,
) -> tuple[int, float, float, float, str]:
    """(requests, p50 s, p99 s, requests per second, verified) of ``clients`` concurrent
    clients for ``--seconds``; a prompt holding UNIQUE is made unique per request (a miss each
    time); ``verified`` says how many answers were 200s of the ``expect``ed tier. Errors fail
    the run, except for the peer (``errors_allowed``), whose errors are reported in the row."""
    cell = wrk(url, prompts, clients, args.seconds, expect)
    if cell.errors and not errors_allowed:
        raise RuntimeError(f"{cell.errors} of {cell.requests} requests to {url} failed")
    verified = f"{cell.ok}/{cell.ok + cell.wrong}" + (f", {cell.errors} errors" if cell.errors else "")
    return cell.requests, cell.p50, cell.p99, cell.rate, verified


def prime(url: str, prompts: list[str]) -> None:
    """Ask each prompt once, so that a cache in front of ``url``'s upstream holds it."""
    with httpx.Client(timeout=60, headers=HEADERS) as client:
        for prompt in prompts:
            client.post(url, json=body(prompt)).raise_for_status()


def metric(proxy: str, name: str) -> float:
    for line in httpx.get(f"{proxy}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def miss_overhead(proxy: str, n: int = 200) -> tuple[float, float, float]:
    """(p50 of x-gpucache-overhead-ms, mean embed ms, mean scan ms) of ``n`` misses asked one
    at a time: the proxy's own time on a miss, and the part of it the embedder and the scan
    took (from /metrics, over the same requests)."""
    before = [
        metric(proxy, m)
        for m in (
            "gpucache_embed_seconds_total",
            "gpucache_embedded_prompts_total",
            "gpucache_scan_seconds_total",
        )
    ]
    overheads = []
    with httpx.Client(timeout=60, headers=HEADERS) as client:
        for i in range(n):
            response = client.post(
                f"{proxy}/v1/chat/completions",
                json=body(f"overhead {i}: what is the sum of {i} and {i + 1}?"),
            )
            response.raise_for_status()
            assert response.headers["x-gpucache"] == "miss"
            overheads.append(float(response.headers["x-gpucache-overhead-ms"]))
    embed, embedded, scan = (
        metric(proxy, m) - b
        for m, b in zip(
            (
                "gpucache_embed_seconds_total",
                "gpucache_embedded_prompts_total",
                "gpucache_scan_seconds_total",
            ),
            before,
        )
    )
    return percentile(overheads, 0.5), 1000 * embed / max(1, embedded), 1000 * scan / n


def warm_up(proxy: str, seconds: float) -> Cell:
    """A proxy that starts empty, 200 clients, 60% of the requests repeats of 40 prompts and
    40% new ones; repeats asked after the first 10 seconds are counted as served or not."""
    prompts = []
    for k in range(200):
        prompts.append(
            f"REPEAT {(k // 5 * 3 + k % 5) % 40}: what is the capital of country number "
            f"{(k // 5 * 3 + k % 5) % 40}?"
            if k % 5 < 3
            else "UNIQUE: what is the sum?"
        )
    return wrk(f"{proxy}/v1/chat/completions", prompts, 200, seconds, warm=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/reports/serve.md")
    parser.add_argument("--token-delay", type=float, default=0.002, help="upstream seconds per word")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one cell")
    parser.add_argument(
        "--before", default=None, help="an earlier report (a file, or REV:PATH in git) set beside this run's"
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("bench/serve.py needs wrk (Debian: apt-get install wrk)")
    if serve_peer.executable() is None:
        sys.exit("bench/serve.py runs LiteLLM beside gpucache: pip install -e '.[bench]'")

    up_port = free_port()
    upstream = start(
        [sys.executable, str(STANDIN), "--port", str(up_port), "--token-delay", str(args.token_delay)],
        f"http://127.0.0.1:{up_port}/v1/models",
    )
    items = workload()
    rows: list[tuple[str, int, int, float, float, float, str]] = []
    throughput: dict[str, float] = {}
    try:
        for window in ("2", "0"):
            port = free_port()
            proxy = start(
                proxy_command(
                    up_port, "--port", str(port), "--lookup-window-seconds", str(float(window) / 1000)
                ),
                f"http://127.0.0.1:{port}/health",
            )
            base = f"http://127.0.0.1:{port}"
            url = f"{base}/v1/chat/completions"
            try:
                hits = asyncio.run(semantic_hits(url, items))
                repeats = [first for first, _ in items]  # stored above: exact repeats
                if window == "2":
                    direct = f"http://127.0.0.1:{up_port}/v1/chat/completions"
                    for clients in CONCURRENCY:
                        for label, target, prompts, expect in (
                            ("upstream directly", direct, [f"direct {clients} UNIQUE: what is the sum?"], ""),
                            ("proxy, miss", url, [f"miss {clients} UNIQUE: what is the sum?"], "miss"),
                            ("proxy, exact hit", url, repeats, "exact"),
                            ("proxy, semantic hit", url, hits, "semantic"),
                        ):
                            rows.append((label, clients, *measure(target, prompts, clients, args, expect)))
                    exact_256 = measure(url, repeats, 256, args, "exact")
                    # exact hits beside misses that keep the embedder busy, both at once
                    misses = start_wrk(url, ["mixed UNIQUE: what is the sum?"], 32, args.seconds)
                    mixed_hits = finish_wrk(start_wrk(url, repeats, 8, args.seconds, "exact"))
                    mixed_misses = finish_wrk(misses)
                    overhead = miss_overhead(base)
                # answers verified as semantic hits per second (a lookup that timed out went
                # upstream, and stored its prompt: later it is an exact hit, not counted here)
                cell = wrk(url, hits, 64, args.seconds, "semantic")
                throughput[window] = cell.ok / cell.seconds
            finally:
                stop(proxy)
        # the peer, in front of the same upstream, under the same exact-hit cells
        peer_port = free_port()
        peer = serve_peer.start(up_port, peer_port)
        try:
            peer_url = f"http://127.0.0.1:{peer_port}/v1/chat/completions"
            prime(peer_url, repeats)
            for clients in (*CONCURRENCY, 256):
                rows.append(
                    (
                        "LiteLLM, exact hit",
                        clients,
                        *measure(peer_url, repeats, clients, args, "exact", errors_allowed=True),
                    )
                )
        finally:
            stop(peer)
        port = free_port()
        proxy = start(
            proxy_command(up_port, "--port", str(port), "--grace", "5"), f"http://127.0.0.1:{port}/health"
        )
        try:
            warm = warm_up(f"http://127.0.0.1:{port}", max(30.0, 3 * args.seconds))
        finally:
            stop(proxy)
    finally:
        stop(upstream)

    info = subprocess.run([sys.executable, "-m", "gpucache", "info"], capture_output=True, text=True).stdout
    info = info.split("\nserve ")[0].strip()  # the machine; the server settings are the defaults
    command = (
        f"python3 bench/serve.py --out {args.out} --token-delay {args.token_delay} "
        f"--seconds {args.seconds}" + (f" --before {args.before}" if args.before else "")
    )
    lines = [
        "# Serving: proxy overhead, exact repeats, overload and batched lookups",
        "",
        f"Command: `{command}` ({run_label()}).",
        f"The upstream answers after {args.token_delay} s per word",
        "(7 words an answer); proxy (`gpucache serve` with its defaults), upstream and the load",
        "generator, wrk (one thread), share this machine. Every answer counted is checked: the",
        '"verified" column counts 200s whose `x-gpucache` header names the tier of the row (a',
        f"lookup that timed out and went upstream is a miss, not a hit). {len(hits)} reworded demo",
        "prompts are answered by meaning and asked in turn for the semantic hits.",
        "",
        "```",
        info,
        "```",
        "",
        "## Latency of one request (ms)",
        "",
        "| path | clients | requests | p50 | p99 | requests/s | verified |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {label} | {clients} | {n} | {1000 * p50:.1f} | {1000 * p99:.1f} | {rate:.0f} | {verified} |"
        for label, clients, n, p50, p99, rate, verified in rows
    ]
    upstream_64 = next(r[5] for r in rows if r[0] == "upstream directly" and r[1] == 64)
    exact_64 = next(r[5] for r in rows if r[0] == "proxy, exact hit" and r[1] == 64)
    peer_64 = next(r[5] for r in rows if r[0] == "LiteLLM, exact hit" and r[1] == 64)
    lines += [
        f"| proxy, exact hit | 256 | {exact_256[0]} | {1000 * exact_256[1]:.1f} | {1000 * exact_256[2]:.1f} "
        f"| {exact_256[3]:.0f} | {exact_256[4]} |",
        "",
        f"Exact hits/s at 64 clients: {exact_64 / upstream_64:.2f}x the upstream's own requests/s at 64; "
        f"at 256 clients: {exact_256[3] / exact_64:.2f}x the figure at 64; "
        f"{exact_64 / peer_64:.1f}x LiteLLM's exact hits/s at 64 (LiteLLM {serve_peer.version()}, "
        "its local exact cache, one worker, a master key, before the same upstream).",
        "",
        "## Exact hits beside misses that saturate the embedder",
        "",
        "8 clients ask stored prompts while 32 clients ask new ones, at once.",
        "",
        "| path | clients | requests | p50 | p99 | requests/s | verified |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| exact hits | 8 | {mixed_hits.requests} | {1000 * mixed_hits.p50:.1f} | "
        f"{1000 * mixed_hits.p99:.1f} | {mixed_hits.rate:.0f} | "
        f"{mixed_hits.ok}/{mixed_hits.ok + mixed_hits.wrong} |",
        f"| misses | 32 | {mixed_misses.requests} | {1000 * mixed_misses.p50:.1f} | "
        f"{1000 * mixed_misses.p99:.1f} | {mixed_misses.rate:.0f} | – |",
        "",
        "## A miss's overhead, one client",
        "",
        f"p50 of `x-gpucache-overhead-ms` (the proxy's time, less the upstream's) over 200 misses: "
        f"{overhead[0]:.2f} ms, of which the embedder took {overhead[1]:.2f} ms and the scan "
        f"{overhead[2]:.2f} ms on average (/metrics): {overhead[0] - overhead[1] - overhead[2]:.2f} ms "
        "beyond embedding and scanning.",
        "",
        "## Warming up under load",
        "",
        f"A proxy started empty; 200 clients for {max(30.0, 3 * args.seconds):.0f} s, 60% of requests "
        "repeats of 40 prompts, 40% new ones.",
        "",
        "| requests | errors | requests/s | repeats after the first 10 s | of them served from the cache |",
        "|---:|---:|---:|---:|---:|",
        f"| {warm.requests} | {warm.errors} | {warm.rate:.0f} | {warm.late} | "
        f"{warm.late_hit} ({100 * warm.late_hit / max(1, warm.late):.1f}%) |",
        "",
        f"Non-200 answers in that run (shed or failed): {warm.wrong}.",
    ]
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
    if args.before:
        lines += serve_compare.before_and_after(serve_compare.read(args.before), "\n".join(lines))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
