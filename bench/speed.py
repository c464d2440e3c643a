"""The speed benchmark: the same work on every available device, beside the tools a user would
pick instead, measured in one run.

What it measures (medians of ``repeat`` synchronized timings after a warm-up):

* machine limits: memory read bandwidth (a large ``sum``) and dense matmul rate per dtype, so
  every scan figure is also a fraction of what the machine can do;
* the embedder: prompts/s of ``TransformerEmbedder`` against sentence-transformers on the same
  prompts and model, with the cosine agreement between the two;
* the scan: queries/s and effective GB/s of ``ExactScanStore.search`` for each N x Q x storage
  mode at the library's default scan budget, with recall@K against a float64 brute force,
  against FAISS ``IndexFlatIP`` and against FAISS's index of the same precision (scalar
  quantizers fp16, 8-bit), configured at their best (BLAS for every batch size, the same
  thread count as torch) where faiss is installed;
* ``get_or_put_all`` end to end on the demo workload (paraphrase-heavy);
* on CUDA, NVML telemetry (memory used, utilisation, power) read during the scan runs.

Data are seeded random unit vectors (the scan's cost does not depend on their meaning).

The parts: speed_timing.py (the timing harness, the machine's limits), speed_cells.py (what is
measured), this module (running them per device, the report as Markdown, JSON and a plot).

    python3 bench/speed.py [--quick] [--device all|cpu|cuda] [--repeat N] [--out bench/reports/bench.md]

(Before it moved out of the package this was ``gpucache bench``; the committed report says so.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from speed_cells import (
    ScanResult,
    bench_embedder,
    bench_end_to_end,
    bench_latency,
    bench_overhead,
    bench_scan,
)
from speed_timing import machine_limits, versions

from gpucache.index.interface import QUANTIZATIONS


@dataclass
class BenchReport:
    device: str
    versions: dict[str, str]
    read_gb_per_s: float
    matmul_tflops: dict[str, float]
    embed: dict[str, Any] = field(default_factory=dict)
    scans: list[ScanResult] = field(default_factory=list)
    end_to_end: dict[str, Any] = field(default_factory=dict)
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    limits_measured: dict[str, dict[str, float]] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)


def _latency_lines(latency: dict[str, Any]) -> list[str]:
    if not latency:
        return []
    yardstick = latency["ms"].get("sentence-transformers encode, batch 1")
    how = latency.get("embedder", {})
    lines = [
        "### One lookup at a time",
        "",
        f"A cache of {latency['n']:,} entries at the default settings (storage "
        f"`{latency.get('quantization', 'fp32')}`; embedder: lean pass "
        f"{'on' if how.get('lean') else 'off'}, packed weights "
        f"{'on' if how.get('packed') else 'off'}, single-text path "
        f"{'on' if how.get('single_text_path') else 'off'}), {latency['count']} "
        'calls of each kind, one at a time, interleaved in rounds; "served as" counts what '
        "each call of a row came to.",
        "",
        "| call | p50 ms | p99 ms | p50 / sentence-transformers batch-1 p50 | served as |",
        "|---|---:|---:|---:|---|",
    ]
    outcomes = latency.get("outcomes", {})
    for name, ms in latency["ms"].items():
        ratio = f"{ms['p50'] / yardstick['p50']:.2f}x" if yardstick else "-"
        kinds = outcomes.get(name)
        served = ", ".join(f"{n} {kind}" for kind, n in kinds.items() if n) if kinds else "-"
        lines.append(f"| {name} | {ms['p50']:.2f} | {ms['p99']:.2f} | {ratio} | {served} |")
    return lines + [""]


def _limits_spread(r: BenchReport) -> str:
    if not r.limits_measured:
        return ""
    start, end = r.limits_measured["start"], r.limits_measured["end"]
    return (
        f"; start {start['read_gb_per_s']:.1f} GB/s and fp32 {1000 * start['fp32']:.0f} "
        f"GFLOP/s, end {end['read_gb_per_s']:.1f} GB/s and {1000 * end['fp32']:.0f} GFLOP/s"
    )


def run_bench(devices: list[torch.device], *, quick: bool, repeat: int) -> list[BenchReport]:
    from gpucache.demo.replay import load_workload

    ns = [10_000] if quick else [10_000, 100_000, 1_000_000]
    qs = [1, 64] if quick else [1, 64, 1024]
    prompts = [item.prompt for item in load_workload()][: 64 if quick else 304]
    reports = []
    for device in devices:
        telemetry: list[dict[str, Any]] = []
        bandwidth, rates = machine_limits(device, repeat, quick)
        report = BenchReport(
            device=str(device), versions=versions(), read_gb_per_s=bandwidth, matmul_tflops=rates
        )
        report.embed = bench_embedder(device, prompts, repeat)
        report.scans = bench_scan(device, ns, qs, list(QUANTIZATIONS), 4, repeat, telemetry=telemetry)
        report.latency = bench_latency(device, 10_000 if quick else 100_000, 20 if quick else 200)
        report.end_to_end = bench_end_to_end(device, 1 if quick else repeat)
        report.end_to_end["overhead"] = [
            bench_overhead(device, 10_000 if quick else 100_000, 1 if quick else repeat, mode)
            for mode in (None, "bf16", "int8")
        ]
        # On a shared machine the limits move with the neighbours' load: measured again at the
        # end, and the higher of the two (what the machine can do) is what fractions are of.
        bandwidth_end, rates_end = machine_limits(device, repeat, quick)
        report.limits_measured = {
            "start": {"read_gb_per_s": bandwidth, **rates},
            "end": {"read_gb_per_s": bandwidth_end, **rates_end},
        }
        report.read_gb_per_s = max(bandwidth, bandwidth_end)
        report.matmul_tflops = {name: max(rates[name], rates_end[name]) for name in rates}
        report.telemetry = telemetry
        reports.append(report)
    return reports


def render(reports: list[BenchReport], command: str) -> str:
    lines = ["# gpucache speed benchmark", "", f"Reproduce: `{command}`", ""]
    for r in reports:
        v = r.versions
        lines += [
            f"## {r.device}",
            "",
            f"Commit {v['commit']}; Python {v['python']}, torch {v['torch']} (CUDA {v['cuda']}), "
            f"transformers {v['transformers']}, faiss {v['faiss']}; {v['machine']}"
            + (f" ({v['cpu_features']})" if "cpu_features" in v else "")
            + f", {v['cpu_threads']} torch threads"
            + (f", numpy's BLAS pool {v['blas_pool']} when idle" if "blas_pool" in v else "")
            + (f"; FAISS's OpenMP pool set to {v['faiss_threads']} threads" if "faiss_threads" in v else "")
            + (
                f"; OPENBLAS_THREAD_TIMEOUT {v['openblas_thread_timeout']}, OMP_NUM_THREADS "
                f"{v['omp_num_threads']}"
                if "omp_num_threads" in v
                else ""
            )
            + ".",
            "",
            f"Machine limits measured in this run (the higher of a measurement at its start and "
            f"one at its end{_limits_spread(r)}): read bandwidth {r.read_gb_per_s:.1f} GB/s; "
            "dense matmul "
            + ", ".join(
                f"{k} {1000 * t:.1f} {'GOP/s' if k == 'int8' else 'GFLOP/s'}"
                for k, t in r.matmul_tflops.items()
            )
            + ".",
            "",
            "### Embedder",
            "",
        ]
        e = r.embed
        lines.append(
            f"{e['prompts']} prompts: gpucache {e['gpucache_prompts_per_s']:.0f} prompts/s "
            f"({e['dtype']})"
            + (
                f"; sentence-transformers {e['sentence_transformers_prompts_per_s']:.0f} "
                f"prompts/s; ratio {e['speedup']:.2f}x; min cosine agreement "
                f"{e['min_cosine']:.6f}."
                if "speedup" in e
                else "."
            )
        )
        if "fp32_prompts_per_s" in e:
            lines.append(
                f"\nThe same embedder all in fp32: {e['fp32_prompts_per_s']:.0f} prompts/s; "
                f"min cosine of the default against it {e['min_cosine_vs_fp32']:.6f} "
                f"(load-time probe check: {e['probe_min_cosine_vs_fp32']:.6f})."
            )
        lines += [
            "",
            "### Scan (top-4, D = 384)",
            "",
            "GB/s = bytes the mode stores for N rows / seconds per batch; fraction = of "
            "the read bandwidth (Q = 1: of a plain sum over the same N rows in fp32, "
            "timed together with the engines, given in the column 'read GB/s'; rows that fit in "
            "the CPU's caches are read at cache speed there) or of the "
            "faster of the mode's and fp32's matmul rate (Q >= 64, 2QND FLOPs).",
            "",
            "| engine | mode | N | Q | ms / batch (spread) | queries/s | GB/s | read GB/s | "
            "fraction | recall@4 | vs FAISS flat | vs FAISS same precision |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        flat = {(s.n, s.q): s.queries_per_s for s in r.scans if s.engine == "faiss" and s.mode == "fp32"}
        same = {(s.n, s.q, s.mode): s.queries_per_s for s in r.scans if s.engine == "faiss"}
        behind = []
        for s in r.scans:
            if s.q == 1:
                frac = s.gb_per_s / (s.read_gb_per_s or r.read_gb_per_s)
            else:
                # the roofline: the faster of the mode's own matmul and fp32 (CUDA widens int8
                # rows to fp32 and measures no int8 rate; CPU fp16 matmuls can be far slower
                # than fp32 ones, and a CPU fp16 batch scans the fp32 copy)
                rate = max(r.matmul_tflops.get(s.mode, 0.0), r.matmul_tflops.get("fp32", 0.0))
                frac = (2 * s.q * s.n * 384 / s.seconds / 1e12) / rate if rate else 0.0
            recall = "-" if s.recall_at_k is None else f"{s.recall_at_k:.4f}"
            versus = "-"
            if s.engine.startswith("gpucache") and (s.n, s.q) in flat:
                ratio = s.queries_per_s / flat[(s.n, s.q)]
                versus = f"{ratio:.2f}x"
                if ratio < 1:
                    behind.append(f"{s.engine} {s.mode} N={s.n} Q={s.q} ({ratio:.3f}x)")
            twin = same.get((s.n, s.q, s.mode)) if s.engine.startswith("gpucache") else None
            versus_same = f"{s.queries_per_s / twin:.2f}x" if twin else "-"
            read = "-" if s.read_gb_per_s is None else f"{s.read_gb_per_s:.1f}"
            lines.append(
                f"| {s.engine} | {s.mode} | {s.n} | {s.q} | {1000 * s.seconds:.2f} "
                f"({1000 * s.spread:.2f}) | {s.queries_per_s:.0f} | {s.gb_per_s:.1f} | "
                f"{read} | {frac:.0%} | {recall} | {versus} | {versus_same} |"
            )
        lines += [
            "",
            "recall@4 is against the true top 4: float64 products on the CPU, outside "
            "every engine measured. 'vs FAISS flat' divides by FAISS IndexFlatIP (fp32); "
            "'vs FAISS same precision' by FAISS's index of the mode's precision (fp32: "
            "IndexFlatIP, fp16: IndexScalarQuantizer QT_fp16, int8: QT_8bit). gpucache's "
            "stores run at the library's default scan budget."
            + (
                " The ratios are of a GPU against FAISS on the CPU (faiss-gpu is not installed)."
                if r.device.startswith("cuda")
                else ""
            ),
        ]
        if flat:
            lines += [
                "",
                "Engines timed together for each (N, Q), in blocks, forward then "
                "reverse order, so the ratios hold on a busy machine. Below FAISS "
                "IndexFlatIP: " + ("; ".join(behind) if behind else "none") + ".",
            ]
        ee = r.end_to_end
        lines += [
            "",
            "### get_or_put_all end to end",
            "",
            f"{ee['prompts']} demo prompts in batches of 32 (embed, scan, verify, store; "
            f"instant loader): {ee['seconds']:.2f} s, {ee['prompts_per_s']:.0f} prompts/s, "
            f"hit rate {ee['hit_rate']:.1%}.",
            "",
        ]
        overheads = ee.get("overhead", [])
        for o in [overheads] if isinstance(overheads, dict) else overheads:  # old reports: one
            near = (
                f", {o['verifier_rejections_per_batch']:.0f} candidates per batch above "
                "the threshold refused by the verifier (entries stored near every prompt)"
                if "verifier_rejections_per_batch" in o
                else ""
            )
            lines += [
                f"Cache overhead at N = {o['n']} stored entries (synthetic vectors{near}, "
                f"{o.get('quantization', 'fp32')} storage), batches "
                f"of {o['batch']} new demo prompts: embedding {1000 * o['embed_s']:.0f} ms "
                "(timed inside the call), "
                f"get_or_put_all {1000 * o['get_or_put_all_s']:.0f} ms, overhead beyond "
                f"embedding and the (instant) loader {o['overhead_fraction']:.1%} of the "
                "embedding time (median of per-run fractions)"
                + (
                    f", of which the similarity scan alone {o['scan_fraction']:.1%} "
                    f"({1000 * o['scan_s']:.0f} ms)"
                    if "scan_fraction" in o
                    else ""
                )
                + ".",
                "",
            ]
        lines += _latency_lines(r.latency)
        if r.telemetry:
            lines += [
                "### NVML telemetry during the scans",
                "",
                "| N | Q | mode | memory used GiB | utilisation | power W |",
                "|---:|---:|---|---:|---:|---:|",
            ]
            for t in r.telemetry:
                lines.append(
                    f"| {t['n']} | {t['q']} | {t['mode']} | "
                    f"{t['memory_used_bytes'] / 2**30:.1f} | {t['utilization_percent']} | "
                    f"{t['power_watts']} |"
                )
            lines.append("")
    if len(reports) > 1:
        cpu = next(r for r in reports if r.device == "cpu")
        lines += ["## GPU vs CPU (same run)", "", "| measure | ratio |", "|---|---:|"]
        for r in reports:
            if r is cpu:
                continue
            lines.append(
                f"| embed prompts/s, {r.device} / cpu | "
                f"{r.embed['gpucache_prompts_per_s'] / cpu.embed['gpucache_prompts_per_s']:.1f}x |"
            )
            lines.append(
                f"| get_or_put_all prompts/s, {r.device} / cpu | "
                f"{r.end_to_end['prompts_per_s'] / cpu.end_to_end['prompts_per_s']:.1f}x |"
            )
            on_cpu = {(s.mode, s.n, s.q): s.queries_per_s for s in cpu.scans if s.engine == "gpucache"}
            largest = max((s.n for s in r.scans), default=0)
            for s in r.scans:
                if s.engine == "gpucache" and s.n == largest and (s.mode, s.n, s.q) in on_cpu:
                    lines.append(
                        f"| scan queries/s, {s.mode}, N = {s.n}, Q = {s.q}, {r.device} / "
                        f"cpu | {s.queries_per_s / on_cpu[(s.mode, s.n, s.q)]:.1f}x |"
                    )
        lines.append("")
    return "\n".join(lines)


def write(reports: list[BenchReport], out: Path, command: str) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(reports, command), encoding="utf-8")
    written = [out]
    data = out.with_suffix(".json")
    data.write_text(json.dumps([asdict(r) for r in reports], indent=1), encoding="utf-8")
    written.append(data)
    from plotting import headless_pyplot

    plt = headless_pyplot()
    if plt is None:
        return written
    fig, axes = plt.subplots(1, len(reports), figsize=(6 * len(reports), 4), squeeze=False)
    for ax, r in zip(axes[0], reports):
        q_max = max(s.q for s in r.scans)
        for engine, mode in sorted({(s.engine, s.mode) for s in r.scans}):
            pts = sorted(
                (s.n, s.queries_per_s)
                for s in r.scans
                if s.engine == engine and s.mode == mode and s.q == q_max
            )
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                "o-" if engine == "gpucache" else "s--",
                label=f"{engine} {mode}",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("stored rows N")
        ax.set_ylabel("queries/s (largest Q)")
        ax.set_title(f"scan on {r.device}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    written.append(png)
    return written


def load_reports(path: Path) -> list[BenchReport]:
    """Reports from a ``bench.json`` written by ``write`` (to re-render without re-running)."""
    reports = []
    for doc in json.loads(path.read_text(encoding="utf-8")):
        doc["scans"] = [ScanResult(**scan) for scan in doc["scans"]]
        reports.append(BenchReport(**doc))
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import shlex
    import sys

    from transformers.utils import logging as hf_logging

    from gpucache.devices import resolve_device
    from gpucache.index.blas_pool import quiet_blas_pool

    parser = argparse.ArgumentParser(description="GPU-vs-CPU benchmark: embedder, scan, end to end")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test for CI")
    parser.add_argument("--device", default="all", help="all (default: cpu and cuda), cpu, cuda")
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per measurement")
    parser.add_argument(
        "--out", default="bench/reports/bench.md", help="report path (JSON and PNG are written beside it)"
    )
    args = parser.parse_args(argv)
    quiet_blas_pool()
    hf_logging.disable_progress_bar()
    if args.device == "all":
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    else:
        devices = [resolve_device(args.device)]
    repeat = args.repeat or (2 if args.quick else 5)
    reports = run_bench(devices, quick=args.quick, repeat=repeat)
    command = (
        "python3 bench/speed.py"
        + (" --quick" if args.quick else "")
        + (f" --device {args.device}" if args.device != "all" else "")
        + f" --out {shlex.quote(args.out)}"
    )
    for path in write(reports, Path(args.out), command):
        print(f"wrote {path}", file=sys.stderr)
    print(Path(args.out).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
