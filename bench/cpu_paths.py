"""The CPU storage modes against each other, and what quantization="auto" makes of them.

Why: whether int8 rows beat fp32 rows depends on the CPU and on the batch. One query streams
every row once, and int8 rows are a quarter of the bytes; a batch is a matrix product, and an
int8 product is fast only where the CPU has VNNI (on an AVX2 EPYC without it, an order of
magnitude slower than fp32). "auto" stores int8 on a CPU and measures, per query bucket and size
class, whether a batch is answered faster from the int8 rows or from the exact fp32 copy the
int8 store keeps anyway (``ExactScanStore.path_chooser``). This script checks that choice
against every explicit mode, all in one process, on the same rows and queries:

    python3 bench/cpu_paths.py --out bench/reports/cpu-paths.md

Columns: fp32, bf16 and fp16 stores; "int8 rows" is an int8 store pinned to its int8 rows for
every batch (what "auto" did before it measured: ``RefinePolicy`` alone); "auto" is the default
store after its measurement settled. Each cell is the best of ``--rounds`` runs, the stores
timed in turn within a round, so the machine's drift falls on all alike.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path

from provenance import run_label  # noqa: E402

# As an application would, before anything loads numpy: quiet numpy's BLAS thread pool
import gpucache

gpucache.quiet_blas_pool()

# isort: split
import torch  # noqa: E402

from gpucache.devices import cpu_features, cpu_vendor  # noqa: E402
from gpucache.index.refine import RefinePolicy  # noqa: E402
from gpucache.index.store import ExactScanStore  # noqa: E402

DIM = 384


def build(n: int, data: torch.Tensor) -> dict[str, ExactScanStore]:
    stores = {
        "fp32": ExactScanStore(DIM, device="cpu", quantization="fp32", initial_rows=n),
        "bf16": ExactScanStore(DIM, device="cpu", quantization="bf16", initial_rows=n),
        "int8 rows": ExactScanStore(
            DIM, device="cpu", quantization="int8", initial_rows=n, refine=RefinePolicy()
        ),
        "auto": ExactScanStore(DIM, device="cpu", quantization="auto", initial_rows=n),
    }
    for store in stores.values():
        store.add(data, 0, [math.inf] * n)
    return stores


def best_ms(store: ExactScanStore, queries: torch.Tensor) -> float:
    started = time.perf_counter()
    store.search(queries, 4, 0)
    return 1000 * (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="100000,1000000", help="stored rows, comma-separated")
    parser.add_argument("--q", default="1,64,256,1024", help="queries per batch, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/reports/cpu-paths.md")
    args = parser.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    qs = [int(x) for x in args.q.split(",")]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in ns:
        data = torch.nn.functional.normalize(torch.randn(n, DIM, generator=gen), dim=1)
        stores = build(n, data)
        auto = stores["auto"]
        for q in qs:
            queries = torch.nn.functional.normalize(torch.randn(q, DIM, generator=gen), dim=1)
            auto.search(queries, 4, 0)  # meets the shape: its measurement starts in a thread
            if auto.path_chooser is not None:
                auto.path_chooser.wait_measured()
            times: dict[str, list[float]] = {name: [] for name in stores}
            for _ in range(args.rounds):
                for name, store in stores.items():
                    times[name].append(best_ms(store, queries))
            best = {name: min(t) for name, t in times.items()}
            path = next(
                (
                    p
                    for shape, p in auto.scan_paths.items()
                    if shape.startswith({1: "1 "}.get(q, "<=64 " if q <= 64 else ">64 "))
                ),
                "-",
            )
            rows.append((n, q, best, path))
            print(n, q, {k: round(v, 1) for k, v in best.items()}, path, file=sys.stderr, flush=True)
        del stores, auto, data
    lines = [
        '# CPU storage paths: quantization="auto" against each explicit mode',
        "",
        "Reproduce: `"
        + (
            f"ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA']} "
            if os.environ.get("ONEDNN_MAX_CPU_ISA")
            else ""
        )
        + f"python3 bench/cpu_paths.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`",
        "",
        f"{run_label()}; "
        f"CPU {cpu_vendor() or 'unknown'} with {' '.join(cpu_features()) or 'no AVX2'}, "
        f"{torch.get_num_threads()} threads; D = {DIM}, k = 4, best of {args.rounds} runs, ms per search."
        + (
            f" oneDNN capped at ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA']}."
            if os.environ.get("ONEDNN_MAX_CPU_ISA")
            else ""
        ),
        "",
        '"int8 rows": an int8 store that answers every batch from its int8 rows (the path "auto" '
        'took before it measured). "auto": the default store, after it measured the shape. '
        '"auto path": what it measured faster, its int8 rows or its exact fp32 copy. '
        '"auto / best": auto against the faster of fp32 and int8 rows.',
        "",
        "| N | Q | fp32 | bf16 | int8 rows | auto | auto path | auto / best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, q, best, path in rows:
        faster = min(best["fp32"], best["int8 rows"])
        lines.append(
            f"| {n:,} | {q} | {best['fp32']:.1f} | {best['bf16']:.1f} | {best['int8 rows']:.1f} | "
            f"{best['auto']:.1f} | {path} | {best['auto'] / faster:.2f}x |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
