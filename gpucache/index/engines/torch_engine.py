"""The torch engine: a chunked matmul with a block top-k per chunk, on the CPU or CUDA.

Each chunk's (Q, C) product is written into one buffer reused across chunks and scans on the
CPU (``gpucache.index.scratch``: fresh pages cost more than the product right after the
embedder ran), then reduced to its top-k through block maxima (``gpucache.index.topk``), and
merged into a running top-k. The scope/expiry mask is applied only to a chunk that has a dead
row: on a full store most chunks have none.

On the CPU the product's layout depends on the shape (``rows_first``): BLAS answers (C, D) x
(D, Q) faster than (Q, D) x (D, C) for few queries (FAISS multiplies this way round too), and
oneDNN's bf16 kernel is faster rows-first only in a band of Q. The measurements behind these
bands are in ``bench/reports/performance-notes.md``.
"""

from __future__ import annotations

import torch

from gpucache.index.engines.base import RowsView, ScanJob
from gpucache.index.scratch import BufferSource
from gpucache.index.topk import RunningTopK, chunk_topk

# Up to this many queries an fp32 CPU product is computed rows-first.
ROWS_FIRST_MAX_QUERIES = 256
# bf16 CPU products are rows-first only in this range of Q (inclusive).
BF16_ROWS_FIRST_QUERIES = (64, 128)


def rows_first(q: int, dtype: torch.dtype) -> bool:
    """Whether a CPU product of ``q`` queries against rows of ``dtype`` is computed as
    (C, D) x (D, Q), the faster layout for that shape."""
    if dtype == torch.float32:
        return q <= ROWS_FIRST_MAX_QUERIES
    low, high = BF16_ROWS_FIRST_QUERIES
    return dtype == torch.bfloat16 and low <= q <= high


def torch_product(
    queries: torch.Tensor, block: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(Q, C) dot products of the queries with a block of rows, in the faster layout.

    ``out``: a 1-D buffer of at least Q x C elements of the block's dtype to write into; the
    result is then a view of it, valid until the next chunk. A rows-first product comes back
    as the transposed view of a (C, Q) tensor."""
    q, c = queries.shape[0], block.shape[0]
    target = None if out is None else out[: q * c]
    if block.device.type == "cpu":
        if q == 1 and block.dtype != torch.float32:
            # a half-precision (1, D) x (D, C) product takes a slow path on the CPU; the same
            # numbers as (C, D) x (D, 1) take a fast one
            return (block @ queries.T).T  # (C, 1) -> (1, C)
        if rows_first(q, block.dtype):
            return torch.matmul(block, queries.T, out=None if target is None else target.view(c, q)).T
    if target is not None:
        return torch.matmul(queries, block.T, out=target.view(q, c))  # (Q, C)
    return queries @ block.T  # (Q, D) @ (D, C) -> (Q, C)


def widened_rows(budget: int, dim: int) -> int:
    """Rows of int8 that widen to fp32 within ``budget`` bytes (one at the least): on CUDA a
    single query's chunk is otherwise the whole store, widened at once."""
    return max(1, budget // (4 * dim))


class TorchEngine:
    """Any storage dtype, any device. int8 rows are widened chunk by chunk (the int8 CPU
    engine multiplies them as int8 where the CPU can)."""

    name = "torch"

    def scan(self, rows: RowsView, job: ScanJob, buffer: BufferSource) -> tuple[torch.Tensor, torch.Tensor]:
        queries, high = job.queries, rows.high
        q, device, dtype = queries.shape[0], queries.device, rows.vectors.dtype
        best = RunningTopK(q, job.k, high, device)
        scratch = None
        if device.type == "cpu" and q > 1 and dtype != torch.int8:
            scratch = buffer(q * min(job.chunk, high), dtype)
        if dtype not in (torch.float32, torch.int8):
            # fp16/bf16 scores, ranked as they are: widening the block to fp32 first cost more
            # than the top-k (the candidates are rescored in fp32 anyway)
            queries = queries.to(dtype)
        chunk = job.chunk
        if dtype == torch.int8:  # each chunk is widened to fp32: (C, D) x 4 bytes within the budget
            chunk = min(chunk, widened_rows(job.budget, rows.vectors.shape[1]))
        for start in range(0, high, chunk):
            stop = min(start + chunk, high)
            block = rows.vectors[start:stop]  # (C, D)
            dead = rows.dead(start, stop, job.scope_id, job.now)  # (C,)
            any_dead = bool(dead.any())  # one pass over C, saving one over Q x C when all live
            if dtype == torch.int8:
                scores = torch_product(queries, block.float()) * rows.scales[start:stop]  # (Q, C)
            else:
                out = None if scratch is None else scratch[: q * (stop - start)]
                scores = torch_product(queries, block, out)  # (Q, C)
            top, columns = chunk_topk(scores, dead, any_dead, min(job.k, stop - start))
            if best.add(top, columns, start, stop):
                break
        return best.result()
