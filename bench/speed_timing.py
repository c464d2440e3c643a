"""The speed benchmark's timing harness and the machine's limits (bench/speed.py)."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence

import torch
from provenance import cpu_model

from gpucache.devices import cpu_features
from gpucache.index.blas_pool import blas_pool_quiet
from gpucache.index.probes import CpuPaths


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeat: int) -> tuple[float, float]:
    """Median and spread (max - min) seconds of ``fn`` over ``repeat`` runs, after a warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), max(times) - min(times)


def read_bandwidth(device: torch.device, repeat: int, megabytes: int = 1024) -> float:
    """GB/s of reading a large fp32 tensor once (a reduction: one read, almost no writes)."""
    x = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    seconds, _ = timed(lambda: x.sum(), device, repeat)
    return x.numel() * 4 / seconds / 1e9


def matmul_rate(device: torch.device, dtype: torch.dtype, repeat: int, size: int) -> float:
    """TFLOP/s (TOP/s for int8) of a square matmul in ``dtype``: the faster of torch's and, for
    fp32 on a CPU, numpy's BLAS (the one the fp32 scan uses on AMD CPUs, where it beat torch's
    MKL). int8 goes through torch._int_mm (int8 x int8 -> int32), the product of the CPU's int8
    scan."""
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (size, size), dtype=torch.int8, device=device)
        b = torch.randint(-127, 128, (size, size), dtype=torch.int8, device=device)
        seconds, _ = timed(lambda: torch._int_mm(a, b), device, repeat)
        return 2 * size**3 / seconds / 1e12
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    seconds, _ = timed(lambda: a @ b, device, repeat)
    if device.type == "cpu" and dtype == torch.float32:
        a_np, b_np = a.numpy(), b.numpy()
        seconds = min(seconds, timed(lambda: a_np @ b_np, device, repeat)[0])
    return 2 * size**3 / seconds / 1e12


BLOCK_SECONDS = 0.2


BLOCK_RUNS = 50


def timed_together(
    fns: Sequence[Callable[[], object]],
    device: torch.device,
    repeat: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[float, float]]:
    """``timed`` for several functions compared with each other: each is timed in a block
    right after the others (seconds apart, where timing all N and Q of one engine before the
    next had let minutes of a shared machine's drift decide the comparison), in forward order
    then in reverse order, so a load that rises or falls through the measurement falls on
    every engine alike. Each block starts with an untimed run: the engines use different
    thread pools (torch's OpenMP, numpy's BLAS, FAISS's OpenMP), and a pool that has just
    worked keeps spinning on the cores for a while (interleaved run by run, FAISS's fp32
    Q = 64 search took 29 ms instead of 4).
    """
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for runs, indices in (((repeat + 1) // 2, order), (repeat // 2, order[::-1])):
        if runs == 0:
            continue
        for i in indices:
            fns[i]()  # settles the thread pools this engine uses
            sync(device)
            spent, done = 0.0, 0
            # fast cases run until the block has taken BLOCK_SECONDS (up to BLOCK_RUNS runs):
            # a median of 3 runs of a 1 ms search is mostly the machine's noise
            while done < runs or (spent < BLOCK_SECONDS and done < BLOCK_RUNS):
                start = clock()
                fns[i]()
                sync(device)
                times[i].append(clock() - start)
                spent += times[i][-1]
                done += 1
    return [(statistics.median(t), max(t) - min(t)) for t in times]


def versions() -> dict[str, str]:
    import transformers

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": str(torch.version.cuda),
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cpu_threads": str(torch.get_num_threads()),
        "cpu_features": " ".join(cpu_features()) or "no AVX2",
        "blas_pool": "quiet" if blas_pool_quiet() else "spinning",
        "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT", "unset"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
    }
    try:
        import faiss

        out["faiss"] = faiss.__version__
        out["faiss_threads"] = str(faiss.omp_get_max_threads())
    except ImportError:
        out["faiss"] = "not installed"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    out["commit"] = commit or "unknown"
    return out


def machine_limits(device: torch.device, repeat: int, quick: bool) -> tuple[float, dict[str, float]]:
    """Read bandwidth (GB/s) and dense matmul rate per dtype (TFLOP/s) of ``device`` now.

    int8 is measured only where the store multiplies in int8 (a CPU with torch._int_mm); a
    CUDA store widens int8 rows to fp32, so fp32 is its int8 roofline."""
    dtypes = [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
    if device.type == "cpu" and CpuPaths.detect().int8_matmul:
        dtypes.append(("int8", torch.int8))
    return read_bandwidth(device, repeat, 256 if quick else 1024), {
        name: matmul_rate(device, dtype, repeat, 512 if quick else 2048) for name, dtype in dtypes
    }
