"""Paired timing of the store's scan: this checkout against the store of another revision.

Why paired: on a shared machine, two runs minutes apart differ by more than most changes to
the scan do. Here both stores hold the same rows and answer the same queries in one process,
timed alternately (one, the other, then the other way round), so the machine's drift falls on
both alike; recall@k of each against an exact scan is checked on the way.

    python3 bench/ab_store.py --base HEAD~3 --n 100000 --q 64,1024 --mode int8

The other revision's whole package is extracted from git and imported beside this checkout's
under another name, so each store runs with its own revision's top-k, scratch and engines.
"""

from __future__ import annotations

import argparse
import importlib
import io
import math
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from provenance import run_label

# As an application would, before anything loads numpy: quiet numpy's BLAS thread pool
# (gpucache/index/blas_pool.py), so both stores run the paths the command runs
import gpucache

gpucache.quiet_blas_pool()

# isort: split
import torch  # noqa: E402

ExactScanStore = gpucache.ExactScanStore


def store_class_at(revision: str) -> type:
    """``ExactScanStore`` as it was at ``revision``: that revision's whole package, extracted
    from git and imported as ``gpucache_base`` beside this checkout's (its modules moved between
    revisions, so one file would not do)."""
    root = Path(tempfile.mkdtemp())
    # before 2026-12 the kernels lived in a top-level kernels/ folder installed as gpucache.kernels
    older = (
        subprocess.run(["git", "cat-file", "-e", f"{revision}:kernels"], capture_output=True).returncode == 0
    )
    archive = subprocess.run(
        ["git", "archive", revision, "gpucache", *(["kernels"] if older else [])],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    package = root / "gpucache_base"
    (root / "gpucache").rename(package)
    if older:
        (root / "kernels").rename(package / "kernels")
    for source in package.rglob("*.py"):
        text = source.read_text()
        source.write_text(re.sub(r"\bgpucache(?=[. ])", "gpucache_base", text))
    sys.path.insert(0, str(root))
    module = importlib.import_module("gpucache_base")
    return module.ExactScanStore


def median_ms(samples: list[float]) -> float:
    return 1000 * sorted(samples)[len(samples) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision whose store to compare")
    parser.add_argument("--n", type=int, default=100_000, help="stored rows")
    parser.add_argument("--q", default="1,64,1024", help="queries per batch, comma-separated")
    parser.add_argument("--mode", default="fp32", help="fp32, fp16, bf16 or int8")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    data = torch.nn.functional.normalize(torch.randn(args.n, 384, generator=gen), dim=1)
    mode = None if args.mode == "fp32" else args.mode
    stores = {"base": store_class_at(args.base), "this": ExactScanStore}
    built = {}
    for name, cls in stores.items():
        store = cls(384, device="cpu", quantization=mode, initial_rows=args.n)
        store.add(data, 0, [math.inf] * args.n)
        built[name] = store
    print(run_label())
    print(f"{args.mode}, N = {args.n}, k = {args.k}: median ms per batch (recall@k vs exact)")
    for q in (int(x) for x in args.q.split(",")):
        queries = torch.nn.functional.normalize(
            data[torch.randint(0, args.n, (q,), generator=gen)] + 0.2 * torch.randn(q, 384, generator=gen),
            dim=1,
        )
        exact = (queries @ data.T).topk(args.k, dim=1).indices.tolist()
        times: dict[str, list[float]] = {name: [] for name in built}
        recall = {}
        for round_ in range(args.rounds):
            order = list(built.items()) if round_ % 2 else list(built.items())[::-1]
            for name, store in order:
                store.search(queries, args.k, 0)  # settles the thread pools
                start = time.perf_counter()
                _, rows = store.search(queries, args.k, 0)
                times[name].append(time.perf_counter() - start)
                found = sum(len(set(a) & set(b)) for a, b in zip(rows.tolist(), exact))
                recall[name] = found / (q * args.k)
        cells = ", ".join(f"{name} {median_ms(t):.1f} ({recall[name]:.4f})" for name, t in times.items())
        print(f"Q = {q}: {cells}")


if __name__ == "__main__":
    sys.exit(main())
