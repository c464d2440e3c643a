"""The int8 CPU engine: int8 rows multiplied as int8, never widened whole.

Batches multiply int8 queries (quantized per query) by the int8 rows into int32 products
(``torch._int_mm``, oneDNN's VNNI kernel), and rank them by block maxima on the int32 products
(``block_topk_scaled``): rows share one scale per block of ``INT8_SCALE_BLOCK`` rows, so only
the chosen blocks are widened to float. A single query takes an int8 GEMV instead
(``torch._weight_int8pack_mm``), which streams the rows once with the scales applied in the
same pass. Both rankings are approximate; the index rescores the candidates in fp32
(``refine.py``), so they can cost a miss, never cause a hit. Where neither private op works on
this build, the torch engine widens chunk by chunk.
"""

from __future__ import annotations

import torch

from gpucache.index.codecs import INT8_SCALE_BLOCK
from gpucache.index.engines.base import RowsView, ScanJob
from gpucache.index.engines.torch_engine import TorchEngine
from gpucache.index.probes import INT8_GEMV_DIM
from gpucache.index.scratch import BufferSource
from gpucache.index.topk import INT32_MASKED, RunningTopK, block_topk, block_topk_scaled


class Int8CpuEngine:
    """int8 storage on the CPU. ``matmul`` and ``gemv`` say which private ops to use
    (``probes.CpuPaths``)."""

    name = "int8-cpu"

    def __init__(self, matmul: bool, gemv: bool) -> None:
        self.matmul, self.gemv = matmul, gemv
        self._widening = TorchEngine()

    def scan(self, rows: RowsView, job: ScanJob, buffer: BufferSource) -> tuple[torch.Tensor, torch.Tensor]:
        if rows.vectors.dtype != torch.int8:
            raise ValueError(f"the int8 engine scans int8 rows, got {rows.vectors.dtype}")
        path = self.path(*job.queries.shape)
        if path == "gemv":
            return self._scan_gemv(rows, job)
        if path == "int32":
            return self._scan_int32(rows, job, buffer)
        return self._widening.scan(rows, job, buffer)

    def path(self, q: int, dim: int) -> str:
        """How ``q`` queries of ``dim`` are multiplied: "gemv" (one query, where the GEMV's
        kernel is right for the dimension), "int32" (int8 x int8 products) or "widen"."""
        if q == 1 and self.gemv and dim % INT8_GEMV_DIM == 0:
            return "gemv"
        return "int32" if self.matmul else "widen"

    def _scan_gemv(self, rows: RowsView, job: ScanJob) -> tuple[torch.Tensor, torch.Tensor]:
        query = job.queries.to(torch.bfloat16)  # (1, D)
        best = RunningTopK(1, job.k, rows.high, query.device)
        for start in range(0, rows.high, job.chunk):
            stop = min(start + job.chunk, rows.high)
            # bf16 scores rank the candidates only; they are rescored in fp32
            scores = torch._weight_int8pack_mm(
                query, rows.vectors[start:stop], rows.scales[start:stop].to(torch.bfloat16)
            )  # (1, C)
            dead = rows.dead(start, stop, job.scope_id, job.now)
            if bool(dead.any()):
                scores.masked_fill_(dead, -torch.inf)
            top, columns = block_topk(scores, min(job.k, stop - start))
            if best.add(top, columns, start, stop):
                break
        return best.result()

    def _scan_int32(
        self, rows: RowsView, job: ScanJob, buffer: BufferSource
    ) -> tuple[torch.Tensor, torch.Tensor]:
        queries, high = job.queries, rows.high
        q = queries.shape[0]
        # queries quantized per row: the scale is the same along a row of products, so the
        # ranking needs none of it; the (Q, K) scores returned take it at the end
        q_scale = queries.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (Q,)
        int8_queries = (queries / q_scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        # chunks start on a scale block, so each chunk's blocks are whole
        chunk = max(INT8_SCALE_BLOCK, job.chunk // INT8_SCALE_BLOCK * INT8_SCALE_BLOCK)
        scratch = buffer(q * min(chunk, high), torch.int32) if q > 1 else None
        best = RunningTopK(q, job.k, high, queries.device)
        for start in range(0, high, chunk):
            stop = min(start + chunk, high)
            out = None if scratch is None else scratch[: q * (stop - start)].view(q, stop - start)
            dots = torch._int_mm(int8_queries, rows.vectors[start:stop].T, out=out)  # (Q, C) int32
            dead = rows.dead(start, stop, job.scope_id, job.now)
            any_dead = bool(dead.any())
            if any_dead:
                dots.masked_fill_(dead, INT32_MASKED)
            top, columns = block_topk_scaled(
                dots, rows.scales[start:stop:INT8_SCALE_BLOCK], min(job.k, stop - start), masked=any_dead
            )  # (Q, k'), (Q, k')
            if best.add(top, columns, start, stop):
                break
        scores, found = best.result()
        return scores * q_scale[:, None], found
