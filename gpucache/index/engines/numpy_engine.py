"""The numpy engine: fp32 rows on a CPU whose fp32 products are faster in numpy's BLAS.

The products run through ``np.matmul`` on the same memory as the torch tensors
(``torch.from_numpy`` shares it), and the loop stays in numpy: following a BLAS product with
torch reductions hands the cores back and forth between two thread pools, and torch's OpenMP
threads spin while BLAS wants the cores (``block_topk_numpy`` says more). The exception is the
top-k of a queries-first block (Q > ``ROWS_FIRST_MAX_QUERIES``), where torch's multi-core topk
outweighs the handoff. Chosen only where OpenBLAS's pool sleeps when idle (``blas_pool.py``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gpucache.index.engines.base import RowsView, ScanJob
from gpucache.index.engines.torch_engine import ROWS_FIRST_MAX_QUERIES
from gpucache.index.scratch import BufferSource
from gpucache.index.topk import block_topk, block_topk_numpy


def numpy_product(queries: np.ndarray, block: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """(Q, C) products, rows-first (a (C, Q) array seen as its transpose) for few queries."""
    q, c = queries.shape[0], block.shape[0]
    if q <= ROWS_FIRST_MAX_QUERIES:
        into = None if out is None else out[: q * c].reshape(c, q)
        return np.matmul(block, queries.T, out=into).T
    into = None if out is None else out[: q * c].reshape(q, c)
    return np.matmul(queries, block.T, out=into)


class NumpyEngine:
    """fp32 rows on the CPU, multiplied by numpy's BLAS."""

    name = "numpy"

    def scan(self, rows: RowsView, job: ScanJob, buffer: BufferSource) -> tuple[torch.Tensor, torch.Tensor]:
        if rows.vectors.dtype != torch.float32 or rows.vectors.device.type != "cpu":
            raise ValueError("the numpy engine scans fp32 rows in host memory")
        high, q, k = rows.high, job.queries.shape[0], job.k
        # computed in numpy, not torch: torch's OpenMP threads keep spinning after a parallel
        # op and slow the product that follows
        dead = (rows.scopes[:high].numpy() != job.scope_id) | (rows.expires[:high].numpy() <= job.now)  # (N,)
        any_dead = bool(dead.any())
        scratch = buffer(q * min(job.chunk, high), torch.float32).numpy()
        queries, vectors = job.queries.numpy(), rows.vectors.numpy()
        best_scores = np.full((q, k), -np.inf, dtype=np.float32)
        best_rows = np.full((q, k), -1, dtype=np.int64)
        for start in range(0, high, job.chunk):
            stop = min(start + job.chunk, high)
            product = numpy_product(queries, vectors[start:stop], scratch)  # (Q, C), no copies
            if q <= ROWS_FIRST_MAX_QUERIES:
                scores = product.T  # (C, Q), contiguous
                if any_dead:
                    scores[dead[start:stop]] = -np.inf  # dead rows, broadcast over queries
                top, idx = block_topk_numpy(scores, min(k, stop - start))  # (Q, k'), (Q, k')
            else:
                # a queries-first block: torch's topk uses every core where numpy's reductions
                # use one, and one call per block leaves the BLAS pool the cores between
                block = torch.from_numpy(product)
                if any_dead:
                    block.masked_fill_(torch.from_numpy(dead[start:stop]), -math.inf)
                top_t, idx_t = block_topk(block, min(k, stop - start))  # (Q, k'), (Q, k')
                top, idx = top_t.numpy(), idx_t.numpy()
            if start == 0 and stop == high and top.shape[1] == k:
                best_scores, best_rows = top, idx  # the whole scan in one block: no merge
                break
            merged_scores = np.concatenate([best_scores, top], axis=1)  # (Q, K + k')
            merged_rows = np.concatenate([best_rows, idx + start], axis=1)  # (Q, K + k')
            pick = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]  # (Q, K)
            best_scores = np.take_along_axis(merged_scores, pick, axis=1)
            best_rows = np.take_along_axis(merged_rows, pick, axis=1)
        best_rows[best_scores == -np.inf] = -1
        return torch.from_numpy(best_scores), torch.from_numpy(best_rows)
