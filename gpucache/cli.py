"""The ``gpucache`` command: ``demo`` (the main job), ``info``.

    gpucache demo [--device auto] [--batch-size 16] [--limit N]
    gpucache info
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence


def _cmd_info(args: argparse.Namespace) -> int:
    import torch

    from gpucache import __version__
    from gpucache.devices import resolve_device
    from gpucache.telemetry import gpu_readings

    print(f"gpucache      {__version__}")
    print(f"python        {platform.python_version()}")
    print(f"torch         {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    print(f"device        {resolve_device('auto')} (chosen by device='auto')")
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


def _cmd_demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from gpucache import SemanticCache
    from gpucache.demo import StandInModel, load_workload, run_demo

    hf_logging.disable_progress_bar()
    started = time.perf_counter()
    print("loading the embedder (all-MiniLM-L6-v2, packaged) ...", file=sys.stderr)
    cache = SemanticCache(device=args.device)
    print(f"ready in {time.perf_counter() - started:.1f} s on {cache.device}", file=sys.stderr)
    model = StandInModel(seconds_per_word=args.seconds_per_word)
    total = len(load_workload()[: args.limit])
    with tqdm(total=total, desc="replaying", unit="prompt", file=sys.stderr) as bar:
        report = run_demo(
            cache, model=model, batch_size=args.batch_size, limit=args.limit, progress=bar.update
        )
    report.render(sys.stdout)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucache", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="replay realistic traffic through a cache (the main job)")
    demo.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]")
    demo.add_argument("--batch-size", type=int, default=16, help="prompts per get_or_put_all")
    demo.add_argument("--limit", type=int, default=None, help="replay only the first N prompts")
    demo.add_argument(
        "--seconds-per-word", type=float, default=0.002,
        help="cost of the stand-in model per generated word (default 0.002)",
    )
    demo.set_defaults(run=_cmd_demo)

    info = sub.add_parser("info", help="device, versions and GPU telemetry")
    info.set_defaults(run=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
