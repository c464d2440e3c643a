"""The benchmark's report: what one run measured per device, as Markdown (for a reader),
JSON (every figure, to re-render or compare) and a PNG plot (queries/s per scan cell, each
device's line beside the other's, log scales).

Each report says what it was run on, read from the run (``machine.py``), what the run left out
and why (``sizing.py``), how long it took and the most memory it held.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpucache.benchmark.scan import ScanResult


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
    # the run itself: sizes chosen, cells left out and why, wall time, memory
    run: dict[str, Any] = field(default_factory=dict)


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


def render(reports: list[BenchReport], command: str) -> str:
    lines = ["# gpucache bench", "", f"Reproduce: `{command}`", ""]
    for r in reports:
        v = r.versions
        lines += [
            f"## {r.device}",
            "",
            f"gpucache {v.get('gpucache', '?')}, commit {v['commit']}; "
            + (f"{v['gpu']}; " if "gpu" in v and r.device.startswith("cuda") else "")
            + (f"{v['processor']}, " if "processor" in v else "")
            + f"Python {v['python']}, torch {v['torch']} (CUDA {v['cuda']}), "
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
        ]
        lines += _run_lines(r.run)
        lines += ["### Embedder", ""]
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
        # old reports timed FAISS's flat index once per (N, Q); this one times it in every cell
        flat = {(s.n, s.q): s.queries_per_s for s in r.scans if s.engine == "faiss" and s.mode == "fp32"}
        same = {(s.n, s.q, s.mode): s.queries_per_s for s in r.scans if s.engine == "faiss"}
        behind = []
        for s in sorted(r.scans, key=_row_order):
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
            yardstick = s.flat_queries_per_s or flat.get((s.n, s.q))
            if s.engine.startswith("gpucache") and yardstick:
                ratio = s.queries_per_s / yardstick
                versus = f"{ratio:.2f}x"
                if ratio < 1:
                    behind.append(f"{s.engine} {s.mode} N={s.n} Q={s.q} ({ratio:.3f}x)")
            twin = same.get((s.n, s.q, s.mode)) if s.engine.startswith("gpucache") else None
            versus_same = f"{s.queries_per_s / twin:.2f}x" if twin else "-"
            read = "-" if s.read_gb_per_s is None else f"{s.read_gb_per_s:.1f}"
            lines.append(
                f"| {s.engine} | {s.mode} | {s.n} | {s.q} | {1000 * s.seconds:.2f} "
                f"({1000 * s.spread:.2f}){' *' if s.timed_calls == 1 else ''} | "
                f"{s.queries_per_s:.0f} | {s.gb_per_s:.1f} | "
                f"{read} | {frac:.0%} | {recall} | {versus} | {versus_same} |"
            )
        lines += [
            "",
            "recall@4 is against the true top 4 of the batch's first 64 queries: float64 "
            "products on the CPU, outside every engine measured. * timed once after a "
            "warm-up: a call of the cell projected past 2 s. 'vs FAISS flat' divides by "
            "FAISS IndexFlatIP (fp32) timed in the same cell; "
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
                "Engines timed together in each cell (N, Q, mode: gpucache's store, FAISS's "
                "index of the same precision, FAISS IndexFlatIP), in blocks, forward then "
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
    cpu = next((r for r in reports if r.device == "cpu"), None)
    if cpu is not None and len(reports) > 1:
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
            for s in sorted(r.scans, key=_row_order):  # every cell both devices ran
                if s.engine == "gpucache" and (s.mode, s.n, s.q) in on_cpu:
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
    png = out.with_suffix(".png")
    if plot(reports, png):
        written.append(png)
    return written


def plot(reports: list[BenchReport], png: Path) -> bool:
    """Queries/s of every scan cell, one panel per query batch Q, N on the x axis, one line
    per (device, engine, mode): each device's gpucache line beside the other's and beside
    FAISS, log scales. False (and nothing written) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: CI and GPU servers have no display
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    qs = sorted({s.q for r in reports for s in r.scans})
    if not qs:
        return False
    fig, axes = plt.subplots(1, len(qs), figsize=(5.5 * len(qs), 4.5), squeeze=False)
    for ax, q in zip(axes[0], qs):
        for r in reports:
            lines = sorted({(s.engine, s.mode) for s in r.scans if s.q == q}, key=lambda em: (em[0], em[1]))
            for engine, mode in lines:
                points = sorted(
                    (s.n, s.queries_per_s)
                    for s in r.scans
                    if s.q == q and (s.engine, s.mode) == (engine, mode)
                )
                style = ("o-" if r.device == "cpu" else "^-") if engine.startswith("gpucache") else "s:"
                where = "cpu" if engine == "faiss" else r.device
                if engine == "faiss" and r.device != "cpu":
                    continue  # FAISS runs on the CPU: its line is the CPU section's
                ax.plot(
                    [n for n, _ in points], [v for _, v in points], style, label=f"{where} {engine} {mode}"
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("stored rows N")
        ax.set_ylabel("queries/s")
        ax.set_title(f"scan, Q = {q}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


MODE_ORDER = ("fp32", "fp16", "bf16", "int8")


def _row_order(s: ScanResult) -> tuple[int, int, bool, int, str]:
    """Rows by N, then Q, gpucache's before FAISS's, modes in their usual order."""
    mode = MODE_ORDER.index(s.mode) if s.mode in MODE_ORDER else len(MODE_ORDER)
    return s.n, s.q, s.engine == "faiss", mode, s.engine


def _run_lines(run: dict[str, Any]) -> list[str]:
    """What the run chose, left out, took and held (absent from reports before it was kept)."""
    if not run:
        return []
    gib = 2**30
    lines = [
        "### This run",
        "",
        f"Wall time {run['seconds']:.0f} s on this device. Stored-row sizes run: "
        + ", ".join(f"{n:,}" for n in run["sizes"])
        + f"; query batches {', '.join(str(q) for q in run['query_batches'])}. Memory: "
        f"{run['available_bytes'] / gib:.1f} GiB available when the scans began, of "
        f"{run['total_bytes'] / gib:.1f} GiB; a scan cell may plan to hold "
        f"{run['memory_fraction']:.0%} of what is available; peak held "
        f"{run['peak_bytes'] / gib:.2f} GiB ({run['peak_bytes'] / run['total_bytes']:.0%} of the "
        f"device's memory; {run['peak_what']}).",
        "",
    ]
    if run.get("missing"):
        lines += ["Not measured, not installed: " + "; ".join(run["missing"]) + ".", ""]
    skipped = run.get("skipped", [])
    if skipped:
        lines += ["Left out:", ""] + [f"- {s['what']}: {s['why']}" for s in skipped] + [""]
    else:
        lines += ["Nothing left out.", ""]
    return lines


def load_reports(path: Path) -> list[BenchReport]:
    """Reports from a ``bench.json`` written by ``write`` (to re-render without re-running)."""
    reports = []
    for doc in json.loads(path.read_text(encoding="utf-8")):
        doc["scans"] = [ScanResult(**scan) for scan in doc["scans"]]
        reports.append(BenchReport(**doc))
    return reports
