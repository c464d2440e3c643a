"""One run of the benchmark: for each device (the CPU, and CUDA where present), the machine's
limits, the embedder, the cache end to end and one lookup at a time, then the scan cells as
far as memory and the time left allow, then the limits again; written as Markdown, JSON and a
PNG beside it.

The cells whose cost is fixed run first, the scans (whose cost grows with N) last, against the
device's share of the run's time (``TimePlan``), so the run ends when it said it would and says
what it left out. Progress goes to stderr, one line per step.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gpucache.benchmark import sizing
from gpucache.benchmark.embedding import bench_embedder
from gpucache.benchmark.lookups import bench_end_to_end, bench_latency, bench_overhead
from gpucache.benchmark.machine import (
    available_bytes,
    machine_limits,
    peak_bytes,
    reset_peak,
    total_bytes,
    versions,
)
from gpucache.benchmark.report import BenchReport, write
from gpucache.benchmark.scan import bench_scan
from gpucache.index.interface import QUANTIZATIONS

INSTALL_HINT = "pip install 'gpucache[bench]'"
# What each optional peer adds, and the module that must import for it
PEERS = {
    "sentence_transformers": "the embedder's yardstick (sentence-transformers)",
    "faiss": "the scan's yardstick (FAISS)",
    "matplotlib": "the PNG plot (matplotlib)",
}


@dataclass(frozen=True)
class BenchOptions:
    """What a run measures and how long it may take."""

    quick: bool = False  # the smallest sizes: a smoke test
    repeat: int = 3  # timed calls per measurement
    minutes: float = 12.0  # the whole run's time, every device together
    memory_fraction: float = sizing.MEMORY_FRACTION
    cell_seconds: float = 60.0  # the most one engine may take in one scan cell


def missing_peers() -> list[str]:
    """The optional peers not installed, each with what it adds and the install hint."""
    return [
        f"{what}: {INSTALL_HINT}"
        for module, what in PEERS.items()
        if importlib.util.find_spec(module) is None
    ]


def run_bench(
    devices: list[torch.device],
    options: BenchOptions,
    *,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    clock: Callable[[], float] = time.perf_counter,
) -> list[BenchReport]:
    from gpucache.demo.replay import load_workload

    start = clock()
    ns = list(sizing.QUICK_SIZES if options.quick else sizing.SIZES)
    qs = list(sizing.QUICK_QUERY_BATCHES if options.quick else sizing.QUERY_BATCHES)
    prompts = [item.prompt for item in load_workload()][: 64 if options.quick else 304]
    fill = 10_000 if options.quick else 100_000
    missing = missing_peers()
    reports = []
    for i, device in enumerate(devices):
        began = clock()
        deadline = began + (options.minutes * 60 - (began - start)) / (len(devices) - i)

        def say(line: str, device: torch.device = device) -> None:
            progress(f"[{clock() - start:6.0f} s] {device}: {line}")

        reset_peak(device)
        say("machine limits")
        limits_began = clock()
        bandwidth, rates = machine_limits(device, options.repeat, options.quick)
        limits_seconds = clock() - limits_began
        report = BenchReport(str(device), versions(), bandwidth, rates)
        say(f"embedder, {len(prompts)} prompts")
        report.embed = bench_embedder(device, prompts, options.repeat)
        say("get_or_put_all end to end")
        report.end_to_end = bench_end_to_end(device, 1 if options.quick else options.repeat)
        say(f"one lookup at a time, {fill:,} entries")
        report.latency = bench_latency(device, fill, 20 if options.quick else 200)
        overheads = []
        for mode in (None, "bf16", "int8"):
            say(f"the cache's own work per batch, {fill:,} entries, {mode or 'fp32'} storage")
            overheads.append(bench_overhead(device, fill, 1 if options.quick else options.repeat, mode))
        report.end_to_end["overhead"] = overheads
        timing = sizing.TimePlan(
            deadline=deadline - limits_seconds,  # the limits are measured again at the end
            cell_seconds=options.cell_seconds,
            repeat=options.repeat,
        )
        # measured now, with the models loaded and the cache cells done (and collected): what
        # the scans may take
        gc.collect()
        plan = sizing.MemoryPlan(
            host_available=available_bytes(torch.device("cpu")),
            device_available=available_bytes(device),
            on_gpu=device.type == "cuda",
            faiss=importlib.util.find_spec("faiss") is not None,
            fraction=options.memory_fraction,
        )
        sizes = plan.sizes(tuple(ns), list(QUANTIZATIONS), max(qs))
        telemetry: list[dict[str, object]] = []
        report.scans = bench_scan(
            device, sizes, qs, list(QUANTIZATIONS), 4, options.repeat, timing,
            clock=clock, progress=say, telemetry=telemetry,
        )  # fmt: skip
        # On a shared machine the limits move with the neighbours' load: measured again at the
        # end, and the higher of the two (what the machine can do) is what fractions are of.
        say("machine limits, again")
        bandwidth_end, rates_end = machine_limits(device, options.repeat, options.quick)
        report.limits_measured = {
            "start": {"read_gb_per_s": bandwidth, **rates},
            "end": {"read_gb_per_s": bandwidth_end, **rates_end},
        }
        report.read_gb_per_s = max(bandwidth, bandwidth_end)
        report.matmul_tflops = {name: max(rates[name], rates_end[name]) for name in rates}
        report.telemetry = telemetry
        report.run = {
            "seconds": clock() - began,
            "sizes": sizes,
            "query_batches": qs,
            "available_bytes": plan.device_available,
            "total_bytes": total_bytes(device),
            "memory_fraction": options.memory_fraction,
            "peak_bytes": peak_bytes(device),
            "peak_what": (
                "torch's peak allocation on the GPU"
                if device.type == "cuda"
                else "the process's peak resident memory, everything before it included"
            ),
            "missing": missing,
            "skipped": [{"what": s.what, "why": s.why} for s in plan.skipped + timing.skipped],
        }
        say(f"done in {report.run['seconds']:.0f} s, peak {report.run['peak_bytes'] / 2**30:.2f} GiB")
        reports.append(report)
    return reports


def devices_for(name: str) -> list[torch.device]:
    """``all``: the CPU, and CUDA where present (GPU against CPU in one run); else one device."""
    from gpucache.devices import resolve_device

    if name == "all":
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    return [resolve_device(name)]


def main(*, device: str, out: str, options: BenchOptions, command: str) -> int:
    """The ``gpucache bench`` command: run, write the three files, say where. ``command`` is
    the line the report gives to reproduce it."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    reports = run_bench(devices_for(device), options)
    for path in write(reports, Path(out), command):
        print(f"wrote {path}", file=sys.stderr)
    for line in missing_peers():
        print(f"not measured: {line}", file=sys.stderr)
    from gpucache.index.kernel_choice import measuring

    if measuring():
        # a store left out for its measurement (the report says which) is still measuring in a
        # daemon thread, maybe inside one product of minutes: the interpreter's exit would wait
        # 30 s for it and then end the process with SIGABRT ("terminate called without an
        # active exception") though every file is written. It ends here instead, at once.
        print(f"ending with {measuring()} scan-path measurement(s) still running", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
