"""The ``gpucache`` command: ``demo`` (the main job), ``serve`` (the caching proxy),
``calibrate`` (the threshold and soft rules from your own labelled pairs), ``explain`` (whether
the cache would serve one prompt's answer for another, and why), ``bench`` (GPU against CPU),
``info``.

    gpucache demo [--model standin|smollm2] [--device auto] [--batch-size 16] [--limit N]
    gpucache calibrate PAIRS.jsonl [--budget 0.01] [--out gpucache.toml]
    gpucache serve --upstream http://127.0.0.1:8000/v1 [--config gpucache.toml] [--<setting> ...]
    gpucache explain "STORED PROMPT" "ASKED PROMPT" [--config gpucache.toml] [--no-embed]
    gpucache bench [--quick] [--device all|cpu|cuda] [--minutes 12] [--out gpucache-bench.md]
    gpucache info [--config gpucache.toml]

``bench`` is the GPU-against-CPU benchmark a user runs on their own machine
(``gpucache.benchmark``). The repository's other reports (the false-hit benchmark, the serving
benchmark) come from scripts under bench/, not commands of the library.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpucache.guard.settings import DECISIONS, GuardSettings


def _cmd_info(args: argparse.Namespace) -> int:
    import torch

    from gpucache import __version__
    from gpucache.cache.settings import CacheSettings
    from gpucache.devices import cpu_features, cpu_has_native_bf16, cpu_vendor, resolve_device
    from gpucache.embedding.lean import packing_available
    from gpucache.index.blas_pool import blas_pool_quiet
    from gpucache.index.codecs import INT8_SCALE_BLOCK
    from gpucache.index.measure import measure_scan_paths
    from gpucache.index.paths import resolve_quantization
    from gpucache.index.probes import INT8_GEMV_DIM, CpuPaths
    from gpucache.pairing.meta import shipped_meta
    from gpucache.telemetry import gpu_readings

    paths = CpuPaths.detect()
    print(f"gpucache      {__version__}")
    print(f"python        {platform.python_version()}")
    print(f"torch         {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    print(f"device        {resolve_device('auto')} (chosen by device='auto')")
    print(
        f"cpu           {cpu_vendor() or 'vendor unknown'}, {' '.join(cpu_features()) or 'no AVX2'}; "
        f"bf16 {'native' if cpu_has_native_bf16() else 'emulated'}"
    )
    packs = ", ".join(
        f"{name} {'yes' if packing_available(torch.device('cpu'), dtype) else 'no'}"
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    )
    print(
        f"embedder cpu  matmuls in {'bf16' if cpu_has_native_bf16() else 'fp32'} where the load-time "
        f"probe agrees; oneDNN packs Linear weights: {packs}"
    )
    from gpucache.embedding.embedder import TransformerEmbedder

    embedder = TransformerEmbedder(device=resolve_device("auto"))  # the stages probe at load
    print("encoder       " + "\n              ".join(embedder.encoder_path.lines()))
    pool = (
        "sleeps when idle"
        if blas_pool_quiet()
        else "spins when idle (set OPENBLAS_THREAD_TIMEOUT=4 before numpy is imported)"
    )
    print(f"fp32 cpu scan {'numpy BLAS' if paths.fp32_via_numpy else 'torch'}; numpy's BLAS pool {pool}")
    int8_batches = (
        f"int8 x int8 -> int32, one scale per {INT8_SCALE_BLOCK} rows"
        if paths.int8_matmul
        else "rows widened to fp32"
    )
    int8_single = (
        f"int8 GEMV (dimensions in multiples of {INT8_GEMV_DIM})" if paths.int8_gemv else "as batches"
    )
    print(f"int8 cpu scan batches {int8_batches}; one query {int8_single}")
    defaults = ", ".join(f"{name}={value!r}" for name, value in CacheSettings().items())
    print(f"settings      {defaults}")
    print(f"guard         decision={GuardSettings().decision!r}; {shipped_meta().describe()}")
    device = resolve_device("auto")
    storage = resolve_quantization(CacheSettings().quantization, device, 384)
    print(f"storage       quantization='auto' stores {storage} on {device} (all-MiniLM-L6-v2, D = 384)")
    if storage in ("int8", "bf16") and device.type == "cpu":
        # measured here, as a store measures itself once it holds PATH_CHOICE_MIN_ROWS rows
        chosen = measure_scan_paths(mode=storage)
        print(
            "scan paths    "
            + "; ".join(
                f"Q = {q}: {'the ' + storage + ' rows' if path == 'quantized' else 'the fp32 copy'} "
                f"({', '.join(f'{name} {sec * 1e3:.1f} ms' for name, sec in timings.items())})"
                for q, (path, timings) in chosen.items()
            )
            + ", 65,536 rows measured here"
        )
    _print_serve_settings(args)
    readings = gpu_readings()
    if not readings:
        print("gpus          none visible to NVML (no driver or no GPU)")
    for r in readings:
        util = "n/a" if r.utilization_percent is None else f"{r.utilization_percent}%"
        power = "n/a" if r.power_watts is None else f"{r.power_watts:.0f} W"
        print(
            f"gpu {r.index}         {r.name}, {r.memory_used_bytes / 2**30:.1f} / "
            f"{r.memory_total_bytes / 2**30:.1f} GiB used, utilisation {util}, power {power}"
        )
    return 0


def _print_serve_settings(args: argparse.Namespace) -> None:
    """``gpucache serve``'s settings as the defaults, the settings file and the environment
    resolve them (flags aside), each with where it came from; secrets only as set or not."""
    from gpucache.serve.settings import ConfigError
    from gpucache.serve.sources import resolve

    try:
        resolved = resolve(None, os.environ, args.config)
    except (ConfigError, OSError) as exc:
        print(f"serve         the settings do not resolve: {exc}")
        return
    print("serve         settings of `gpucache serve` here (before its flags):")
    for line in resolved.lines():
        print(f"  {line}")


def _cmd_demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from gpucache import SemanticCache
    from gpucache.demo.replay import StandInModel, load_workload, run_demo

    hf_logging.disable_progress_bar()
    model: Any = StandInModel(seconds_per_word=args.seconds_per_word)
    if args.model == "smollm2":
        from gpucache.demo.local_model import LocalModel, MissingModel

        started = time.perf_counter()
        print("loading SmolLM2-135M-Instruct (packaged GGUF, fp32 on the CPU) ...", file=sys.stderr)
        try:
            model = LocalModel.smollm2(max_new_tokens=args.max_new_tokens)
        except MissingModel as exc:
            print(f"gpucache demo: {exc}", file=sys.stderr)
            return 2
        print(
            f"loaded in {time.perf_counter() - started:.1f} s; greedy, at most {args.max_new_tokens} "
            "new tokens an answer, one batched generate call for each batch's misses",
            file=sys.stderr,
        )
    started = time.perf_counter()
    print("loading the embedder (all-MiniLM-L6-v2, packaged) ...", file=sys.stderr)
    cache = SemanticCache(device=args.device)
    print(
        f"ready in {time.perf_counter() - started:.1f} s on {cache.device}: "
        f"{getattr(cache.embedder, 'path', type(cache.embedder).__name__)}",
        file=sys.stderr,
    )
    total = len(load_workload()[: args.limit])
    desc = "replaying (generating the misses)" if args.model == "smollm2" else "replaying"
    with tqdm(total=total, desc=desc, unit="prompt", file=sys.stderr) as bar:
        report = run_demo(
            cache, model=model, batch_size=args.batch_size, limit=args.limit, progress=bar.update
        )
    report.render(sys.stdout)
    if args.model == "smollm2":
        print(f"  answers capped at     {args.max_new_tokens} new tokens (greedy)")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from gpucache.calibrate import run

    return run(args)


def serve_config(args: argparse.Namespace) -> Any:
    """The ``ServeSettings`` of ``gpucache serve``: its flags over the ``GPUCACHE_*``
    environment over the ``--config`` file over the defaults (gpucache.serve.sources);
    ``ConfigError`` (a ValueError) says which setting is wrong."""
    from gpucache.serve.sources import resolve

    return resolve(args, os.environ, getattr(args, "config", None)).settings()


def _cmd_serve(args: argparse.Namespace) -> int:
    from gpucache.extras import MissingExtra, missing

    try:
        try:
            import uvicorn
        except ImportError as exc:
            raise missing("serve", "gpucache serve", exc) from exc
        from gpucache.serve.app import create_app
        from gpucache.serve.connections import header_deadline
    except MissingExtra as exc:
        print(f"gpucache serve: {exc}", file=sys.stderr)
        return 2
    try:
        config = serve_config(args).resolved()
    except (OSError, TypeError, ValueError) as exc:
        print(f"gpucache serve: {exc}", file=sys.stderr)
        return 2
    if config.auth == "upstream":  # create_app asks again: this is for a clear refusal
        import asyncio

        from gpucache.serve.auth import NOT_AN_AUTHORITY, upstream_is_authority

        if asyncio.run(upstream_is_authority(config.upstream, config.auth_timeout)) is False:
            print(f"gpucache serve: {NOT_AN_AUTHORITY}", file=sys.stderr)
            return 2
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        timeout_graceful_shutdown=config.grace,
        http=header_deadline(config.header_timeout),
    )
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import shlex

    from gpucache.benchmark.runner import BenchOptions, main

    defaults = BenchOptions()
    options = BenchOptions(
        quick=args.quick,
        repeat=args.repeat or (1 if args.quick else defaults.repeat),
        minutes=args.minutes,
        memory_fraction=args.memory_fraction,
        cell_seconds=args.cell_seconds,
    )
    if options.repeat < 1 or options.minutes <= 0 or not 0 < options.memory_fraction <= 1:
        print("gpucache bench: --repeat >= 1, --minutes > 0, 0 < --memory-fraction <= 1", file=sys.stderr)
        return 2
    given = [
        ("--quick", args.quick, False),
        (f"--device {args.device}", args.device, "all"),
        (f"--repeat {args.repeat}", args.repeat, None),
        (f"--minutes {args.minutes:g}", args.minutes, defaults.minutes),
        (f"--memory-fraction {args.memory_fraction:g}", args.memory_fraction, defaults.memory_fraction),
        (f"--cell-seconds {args.cell_seconds:g}", args.cell_seconds, defaults.cell_seconds),
    ]
    command = "gpucache bench" + "".join(f" {flag}" for flag, value, default in given if value != default)
    command += f" --out {shlex.quote(args.out)}"
    return main(device=args.device, out=args.out, options=options, command=command)


def _cmd_explain(args: argparse.Namespace) -> int:
    """The cache's decision on one pair, as a lookup makes it: the prompt stored, the prompt
    asked, what of each the cache reads as the request, their similarity beside the threshold,
    and the guard's verdict with the rule that decided (the same ``explain`` the cache counts
    its refusals by)."""
    from gpucache.cache.settings import CacheSettings, read_settings_file
    from gpucache.cache.validation import check_prompt
    from gpucache.guard.verifier import WeighsSimilarity

    settings, guard, model = CacheSettings(), GuardSettings(), None
    try:
        if args.config:
            settings, guard, model = read_settings_file(args.config)
        if args.decision is not None and args.decision != guard.decision:
            guard = GuardSettings(guard.skip_rules if args.decision == "rules" else (), args.decision)
        for what, prompt in (("the stored prompt", args.stored), ("the asked prompt", args.asked)):
            check_prompt(prompt, what)
    except ValueError as exc:
        print(f"gpucache explain: {exc}", file=sys.stderr)
        return 2
    threshold = settings.threshold if args.threshold is None else args.threshold
    verifier = guard.build()
    requests = [verifier.request(args.stored), verifier.request(args.asked)]
    print(f"stored     {args.stored!r}\n  request  {requests[0]!r}")
    print(f"asked      {args.asked!r}\n  request  {requests[1]!r}")
    similarity = None
    if not args.no_embed:
        from gpucache import TransformerEmbedder
        from gpucache.devices import resolve_device

        embedder = TransformerEmbedder(*([model] if model else []), device=resolve_device(args.device))
        vectors = embedder.encode(requests)
        similarity = float((vectors[0] * vectors[1]).sum())
        print(f"similarity {similarity:.3f} of the requests (threshold {threshold})")
    if similarity is not None and isinstance(verifier, WeighsSimilarity):
        verdict = verifier.judge(args.stored, args.asked, similarity)  # a decision weighing the similarity
    else:
        verdict = verifier.explain(args.stored, args.asked)
    print(f"guard      {verdict}")
    if similarity is not None and similarity < threshold:
        print("decision   a miss: below the threshold, the guard is not asked")
    elif verdict.rejected:
        print(f"decision   a miss: the guard refuses ({verdict.rule})")
    else:
        print(
            "decision   served"
            if similarity is not None
            else "decision   the guard serves it where the similarity reaches the threshold"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucache", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="replay realistic traffic through a cache (the main job)")
    demo.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]")
    demo.add_argument("--batch-size", type=int, default=16, help="prompts per get_or_put_all")
    demo.add_argument("--limit", type=int, default=None, help="replay only the first N prompts")
    demo.add_argument(
        "--seconds-per-word",
        type=float,
        default=0.002,
        help="cost of the stand-in model per generated word (default 0.002)",
    )
    demo.add_argument(
        "--model",
        default="standin",
        choices=["standin", "smollm2"],
        help="what answers the misses: the stand-in (default) or SmolLM2-135M-Instruct, "
        "generating (needs: bash scripts/install.sh demo-model)",
    )
    demo.add_argument(
        "--max-new-tokens",
        type=int,
        default=48,
        help="the longest answer SmolLM2 writes, in tokens (default 48)",
    )
    demo.set_defaults(run=_cmd_demo)

    cal = sub.add_parser("calibrate", help="choose the threshold and soft rules from your labelled pairs")
    cal.add_argument("pairs", help="JSONL of {a, b, label}: 1 the same request, 0 a different one")
    cal.add_argument(
        "--budget",
        type=float,
        default=0.01,
        help="most false hits allowed, on the upper confidence bound (default 0.01)",
    )
    cal.add_argument("--confidence", type=float, default=0.95, help="of the bound (default 0.95)")
    cal.add_argument(
        "--out", default="gpucache.toml", help="the settings file written (default gpucache.toml)"
    )
    cal.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]")
    cal.add_argument("--model", default=None, help="the embedding model (default: the packaged one)")
    cal.set_defaults(run=_cmd_calibrate)

    serve = sub.add_parser("serve", help="an OpenAI-compatible caching proxy in front of a model server")
    serve.add_argument(
        "--config",
        default=None,
        metavar="TOML",
        help="a settings file (or GPUCACHE_CONFIG); the environment's GPUCACHE_* "
        "variables override it, and flags override both",
    )
    from gpucache.serve.sources import add_arguments

    add_arguments(serve)  # every setting, from its dataclass field
    serve.set_defaults(run=_cmd_serve)

    explain = sub.add_parser("explain", help="would the cache serve one prompt's answer for another, and why")
    explain.add_argument("stored", help="the prompt whose answer the cache holds")
    explain.add_argument("asked", help="the prompt asked now")
    explain.add_argument(
        "--config",
        default=None,
        metavar="TOML",
        help="the [cache] threshold and [guard] skip_rules and decision of this settings file",
    )
    explain.add_argument(
        "--decision",
        choices=DECISIONS,
        default=None,
        help="how the guard decides past its named rules (default: the settings' decision, else rules)",
    )
    explain.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="the similarity a candidate needs (default: the settings' threshold)",
    )
    explain.add_argument(
        "--no-embed", action="store_true", help="the guard's verdict alone, without loading the embedder"
    )
    explain.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]")
    explain.set_defaults(run=_cmd_explain)

    bench = sub.add_parser(
        "bench",
        help="GPU against CPU: the embedder, the scan per storage mode and size, the cache end "
        "to end, beside FAISS and sentence-transformers where installed",
    )
    bench.add_argument("--quick", action="store_true", help="the smallest sizes: a smoke test")
    bench.add_argument(
        "--device", default="all", help="all (default: the CPU, and CUDA where present), cpu, cuda"
    )
    bench.add_argument("--repeat", type=int, default=None, help="timed calls per measurement (default 3)")
    bench.add_argument(
        "--minutes",
        type=float,
        default=12.0,
        help="the whole run's time; scan cells that would pass it are left out and named (default 12)",
    )
    bench.add_argument(
        "--memory-fraction",
        type=float,
        default=0.5,
        help="of the memory available when the scans begin, what one scan cell may hold (default 0.5)",
    )
    bench.add_argument(
        "--cell-seconds",
        type=float,
        default=60.0,
        help="the most one engine may take in one scan cell, projected from the size below (default 60)",
    )
    bench.add_argument(
        "--out",
        default="gpucache-bench.md",
        help="the Markdown report; the JSON and PNG are written beside it (default gpucache-bench.md)",
    )
    bench.set_defaults(run=_cmd_bench)

    info = sub.add_parser("info", help="device, versions and GPU telemetry")
    info.add_argument(
        "--config",
        default=None,
        metavar="TOML",
        help="also print the server settings this file and the environment resolve to",
    )
    info.set_defaults(run=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The command is an application: it quiets numpy's BLAS pool for itself, before anything
    # here imports numpy (gpucache/index/blas_pool.py says why)
    from gpucache.index.blas_pool import quiet_blas_pool

    quiet_blas_pool()
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
