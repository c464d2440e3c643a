"""What the machine is and can do, read from the run itself: the commit and versions, the CPU,
the memory there is to spend (``available_bytes``) and what the run spent (``peak_bytes``), and
the limits its figures are fractions of (read bandwidth, matmul rate per dtype).

Every report states these so that a figure can be traced to what produced it: a fixed string
such as "fp32" once labelled a run whose CPU had chosen bf16 matmuls, and a benchmark that did
not look at the memory it had ran until the kernel killed it.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import torch

from gpucache.benchmark.timing import timed
from gpucache.devices import cpu_features
from gpucache.index.blas_pool import blas_pool_quiet
from gpucache.index.probes import CpuPaths

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def commit() -> str:
    """The checkout's short commit, with "+changes" where tracked files differ from it; "not a
    checkout" for an installed package (its version says what it is)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "not a checkout"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what the platform reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (Linux); empty elsewhere."""
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            parts = value.split()
            if parts and parts[0].isdigit():
                out[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def total_bytes(device: torch.device) -> int:
    """The device's memory: the machine's RAM for the CPU, the GPU's for CUDA."""
    return _memory(device, total=True)


def available_bytes(device: torch.device) -> int:
    """Memory the run may still take on ``device`` without pushing anything out: the kernel's
    estimate (MemAvailable, which counts reclaimable caches) for the CPU, what the driver says
    is free for CUDA."""
    return _memory(device, total=False)


def _memory(device: torch.device, *, total: bool) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1 if total else 0])
    name, pages = ("MemTotal", "SC_PHYS_PAGES") if total else ("MemAvailable", "SC_AVPHYS_PAGES")
    info = _meminfo()
    return info[name] if name in info else int(os.sysconf("SC_PAGE_SIZE") * os.sysconf(pages))


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports kilobytes, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_bytes(device: torch.device) -> int:
    """The most the run held on ``device``: peak RSS for the CPU, torch's peak allocation for
    CUDA (reset per device run by ``reset_peak``)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def versions() -> dict[str, str]:
    import transformers

    from gpucache import __version__

    out = {
        "gpucache": __version__,
        "commit": commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": str(torch.version.cuda),
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "cpu_threads": str(torch.get_num_threads()),
        "cpu_features": " ".join(cpu_features()) or "no AVX2",
        "blas_pool": "quiet" if blas_pool_quiet() else "spinning",
        "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT", "unset"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
    }
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    try:
        import faiss

        out["faiss"] = faiss.__version__
        out["faiss_threads"] = str(faiss.omp_get_max_threads())
    except ImportError:
        out["faiss"] = "not installed"
    return out


def read_bandwidth(device: torch.device, repeat: int, megabytes: int = 1024) -> float:
    """GB/s of reading a large fp32 tensor once (a reduction: one read, almost no writes)."""
    x = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    seconds, _ = timed(lambda: x.sum(), device, repeat)
    return x.numel() * 4 / seconds / 1e9


def matmul_rate(device: torch.device, dtype: torch.dtype, repeat: int, size: int) -> float:
    """TFLOP/s (TOP/s for int8) of a square matmul in ``dtype``: the faster of torch's and, for
    fp32 on a CPU, numpy's BLAS (the one the fp32 scan uses on AMD CPUs, where it beat torch's
    MKL). int8 goes through torch._int_mm (int8 x int8 -> int32), the product of the CPU's int8
    scan. A dtype the machine only emulates (bf16 on a CPU without it ran at 1.3 GFLOP/s: 13 s
    a call at 2048) is measured at 512, where one call says as much in a fraction of the time."""
    if size > SMALL_MATMUL:
        small = _matmul_seconds(device, dtype, 1, SMALL_MATMUL)
        if small * (size / SMALL_MATMUL) ** 3 > SLOW_MATMUL_SECONDS:
            size = SMALL_MATMUL
    return 2 * size**3 / _matmul_seconds(device, dtype, repeat, size) / 1e12


SMALL_MATMUL = 512
SLOW_MATMUL_SECONDS = 1.0  # a call projected past this is measured at SMALL_MATMUL instead


def _matmul_seconds(device: torch.device, dtype: torch.dtype, repeat: int, size: int) -> float:
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (size, size), dtype=torch.int8, device=device)
        b = torch.randint(-127, 128, (size, size), dtype=torch.int8, device=device)
        return timed(lambda: torch._int_mm(a, b), device, repeat)[0]
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    seconds, _ = timed(lambda: a @ b, device, repeat)
    if device.type == "cpu" and dtype == torch.float32:
        a_np, b_np = a.numpy(), b.numpy()
        seconds = min(seconds, timed(lambda: a_np @ b_np, device, repeat)[0])
    return seconds


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
