"""What this machine's CPU and torch build can do for the scan, probed on first use.

Nothing is probed at import: each answer is computed the first time an index asks for it and
remembered for the process. The engines (``engines/``) are chosen from these answers once per
index, so the choice depends on the machine and the environment, never on import order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from gpucache.devices import cpu_vendor
from gpucache.index.blas_pool import blas_pool_quiet

# torch 2.13's int8 GEMV checks no shape: it returned wrong sums for dimensions that are not
# multiples of this (24, 33, 385), or crashed the process (1, 3, 7 with 5 rows), so the scan
# takes it only for dimensions that are.
INT8_GEMV_DIM = 16


@functools.cache
def int8_matmul_works() -> bool:
    """torch._int_mm (a private op, CPU support since torch 2.2) on a tiny case."""
    try:
        a = torch.ones((1, 8), dtype=torch.int8)
        return int(torch._int_mm(a, torch.ones((8, 3), dtype=torch.int8).T.T)[0, 0]) == 8
    except (RuntimeError, AttributeError, TypeError):
        return False


@functools.cache
def int8_gemv_works() -> bool:
    """torch._weight_int8pack_mm (a private op: bf16 activations against int8 rows with one
    scale per row, made for weight-only quantized decoding) on a tiny case."""
    try:
        a = torch.full((1, 32), 0.5, dtype=torch.bfloat16)
        rows = torch.ones((4, 32), dtype=torch.int8)
        scales = torch.full((4,), 2.0, dtype=torch.bfloat16)
        out = torch._weight_int8pack_mm(a, rows, scales)
        return out.shape == (1, 4) and bool((out.float() == 32.0).all())
    except (RuntimeError, AttributeError, TypeError):
        return False


@dataclass(frozen=True)
class CpuPaths:
    """The CPU's fast product paths an index may take.

    ``fp32_via_numpy``: fp32 products through numpy's OpenBLAS. torch's CPU builds use MKL,
    which takes slow generic code paths on AMD processors, where OpenBLAS was the faster by
    about 1.3-2.8x (``bench/reports/bench.md``); only where OpenBLAS's pool sleeps when idle
    (``blas_pool.py``), or it would slow the embedder that runs next.
    ``int8_matmul``: int8 x int8 -> int32 products (``torch._int_mm``).
    ``int8_gemv``: a single query against int8 rows (``torch._weight_int8pack_mm``).
    """

    fp32_via_numpy: bool
    int8_matmul: bool
    int8_gemv: bool

    @staticmethod
    def detect() -> CpuPaths:
        return _detected()

    def int8_gemv_for(self, dim: int) -> bool:
        return self.int8_gemv and dim % INT8_GEMV_DIM == 0


@functools.cache
def _detected() -> CpuPaths:
    return CpuPaths(
        fp32_via_numpy=cpu_vendor() == "AuthenticAMD" and blas_pool_quiet(),
        int8_matmul=int8_matmul_works(),
        int8_gemv=int8_gemv_works(),
    )
