"""The Triton engine: the fused scan-and-top-k kernel of ``gpucache.kernels``.

fp32, fp16 and bf16 rows, on CUDA or under Triton's CPU interpreter. The kernel keeps each
tile's survivors and never materialises the (Q, N) score matrix. This wrapper launches it on
slices of the rows, merged with a running top-k, so that:

- its intermediates (each tile's ``k`` survivors: a score and a row, 12 bytes, per query per
  ``BLOCK_N`` rows) stay within the scan budget;
- the kernel's 32-bit row offsets (row x stride) and its launch grid (at most 65,535 tiles of
  rows) never overflow, whatever the store's size;
- a ``k`` beyond what the kernel keeps per tile (``MAX_K``: a quantized store over-fetches
  ``4k + 16``) goes to the torch engine instead of failing;
- bf16 rows on a GPU older than compute capability 8.0 (no bf16 in Triton's code generation
  there) go to the torch engine too.
"""

from __future__ import annotations

import torch

from gpucache.index.engines.base import RowsView, ScanJob
from gpucache.index.engines.torch_engine import TorchEngine
from gpucache.index.scratch import BufferSource
from gpucache.index.topk import RunningTopK

BLOCK_N = 128  # rows per tile: scan_topk's default
MAX_GRID_TILES = 65_535  # CUDA's limit on the launch grid's second dimension
SURVIVOR_BYTES = 12  # a float32 score and an int64 row


def launch_rows(dim: int, block_n: int = BLOCK_N) -> int:
    """The most rows one launch may cover: its offsets (row x ``dim``) below 2^31, its tiles
    within the grid. A multiple of ``block_n``."""
    by_offset = (2**31 - 1) // dim
    by_grid = MAX_GRID_TILES * block_n
    return max(block_n, min(by_offset, by_grid) // block_n * block_n)


BF16_MIN_CAPABILITY = (8, 0)


def kernel_takes(dtype: torch.dtype, capability: tuple[int, int] | None) -> bool:
    """Whether the kernel can scan rows of ``dtype`` on a device of this CUDA compute
    ``capability`` (None: the CPU, under Triton's interpreter)."""
    if dtype == torch.bfloat16 and capability is not None:
        return capability >= BF16_MIN_CAPABILITY
    return dtype in (torch.float32, torch.float16, torch.bfloat16)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of ``device``, None for a CPU."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def budget_rows(budget: int, queries: int, k: int, block_n: int = BLOCK_N) -> int:
    """The most rows one launch may cover with its survivors within ``budget`` bytes."""
    per_tile = queries * min(k, block_n) * SURVIVOR_BYTES
    return max(block_n, budget // per_tile * block_n)


class TritonEngine:
    name = "triton"

    def __init__(self) -> None:
        self._torch = TorchEngine()

    def scan(self, rows: RowsView, job: ScanJob, buffer: BufferSource) -> tuple[torch.Tensor, torch.Tensor]:
        from gpucache.kernels import MAX_K, scan_topk  # imports triton: only for an index that uses it

        if job.k > MAX_K or not kernel_takes(rows.vectors.dtype, device_capability(rows.vectors.device)):
            return self._torch.scan(rows, job, buffer)
        queries = job.queries.to(rows.vectors.dtype)
        q, dim = queries.shape
        # the scan's own chunk too, so a budget set for the torch engine's scores holds here
        step = min(launch_rows(dim), budget_rows(job.budget, q, job.k), max(BLOCK_N, job.chunk))
        best = RunningTopK(q, job.k, rows.high, queries.device)
        for start in range(0, rows.high, step):
            stop = min(start + step, rows.high)
            live = ~rows.dead(start, stop, job.scope_id, job.now)  # (C,)
            top, columns = scan_topk(queries, rows.vectors[start:stop], live, job.k)  # (Q, K)
            if best.add(top, columns, start, stop):
                break
        return best.result()
