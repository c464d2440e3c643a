"""Which storage mode a store takes on its device, and which path a quantized CPU store scans
by before it has measured its own: the choices ``ExactScanStore`` (store.py) makes at
construction and before its first measurement (measure.py measures as a store does).
"""

from __future__ import annotations

import torch

from gpucache.index.interface import AUTO
from gpucache.index.probes import CpuPaths

# A quantized CPU store measures its two scan paths from this size on (``path_chooser``): a
# scan of fewer rows takes milliseconds either way, and every 4x of growth is measured again.
PATH_CHOICE_MIN_ROWS = 16_384


def resolve_quantization(
    quantization: str | None,
    device: torch.device,
    dim: int,
    max_device_bytes: int | None = None,
    scan_kernel: str = "auto",
) -> str:
    """The storage mode a store takes: None is "fp32"; "auto" is "int8" on a CPU whose torch
    has the int8 GEMV for ``dim`` (``probes.CpuPaths.int8_gemv_for``) and "fp32" elsewhere.

    Why int8 on a CPU: a single lookup, what a proxy at low concurrency waits on, streams every
    stored row once, and int8 rows are a quarter of fp32's bytes; batches are faster too
    (``bench/reports/bench.md``). Scores stay exact (the candidates are rescored from the fp32
    copy), so int8 can cost a miss, never cause a hit. But that copy lives in the same memory
    on a CPU, so an int8 CPU store holds more bytes per entry than fp32: under a memory cap
    (``max_device_bytes``) "auto" stays fp32, which fits the most entries, and so it does for
    the Triton kernel, which scans no int8. On CUDA the fp32 scan is already a fraction of the
    embedding and needs no host copy, so "auto" is fp32."""
    if quantization is None:
        return "fp32"
    if quantization != AUTO:
        return quantization
    if (
        device.type == "cpu"
        and max_device_bytes is None
        and scan_kernel != "triton"
        and CpuPaths.detect().int8_gemv_for(dim)
    ):
        return "int8"
    return "fp32"


def unmeasured_path(queries: int, rows: int) -> str:
    """A quantized CPU store's path before (or without) a measurement: one query scans the
    quantized rows (int8's GEMV streams a quarter of fp32's bytes, the reason "auto" takes
    int8, and was the faster on every CPU measured); a batch scans the exact copy, whose fp32
    product is never far from the best, where an int8 batch product on a CPU without VNNI was
    reported far slower than it."""
    return "quantized" if queries <= 1 else "copy"
