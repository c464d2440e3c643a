"""The Triton engine: the fused scan-and-top-k kernel of ``gpucache.kernels``.

fp32, fp16 and bf16 rows, on CUDA or under Triton's CPU interpreter. The kernel keeps each
tile's survivors and never materialises the (Q, N) score matrix.
"""

from __future__ import annotations

import torch

from gpucache.index.engines.base import RowsView, ScanJob
from gpucache.index.scratch import BufferSource


class TritonEngine:
    name = "triton"

    def scan(self, rows: RowsView, job: ScanJob, buffer: BufferSource) -> tuple[torch.Tensor, torch.Tensor]:
        from gpucache.kernels import scan_topk  # imports triton: only for an index that uses it

        high = rows.high
        live = ~rows.dead(0, high, job.scope_id, job.now)  # (N,)
        return scan_topk(job.queries.to(rows.vectors.dtype), rows.vectors[:high], live, job.k)
