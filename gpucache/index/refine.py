"""Refine: a quantized scan over-fetches candidates, then rescores them exactly.

A quantized index (fp16, bf16, int8) keeps a full-precision fp32 copy of its rows in host
memory (``FullCopy``). Its scan keeps ``overfetch(k) = 4k + 16`` candidates by quantized score,
which are then rescored from the copy (FAISS's ``IndexRefine`` is the model). The scores the
cache sees are exact, so quantization can only cost a miss (a true best row the quantized scan
ranked below the over-fetch), never cause a hit.

When to skip the quantized scan and scan the exact copy instead (``RefinePolicy``), on a CPU
index with the torch kernel, for a batch (Q > 1):
- fp16: always. x86 has no fast fp16 matmul and widening the rows costs more than the product;
  the copy is in the same memory, and its exact scores need no over-fetch or rescore.
- bf16 and int8: only for a small index asked many queries at once, where the per-query
  over-fetch and rescore cost more than the faster quantized product saves. The sizes come from
  paired measurements (``bench/reports/performance-notes.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

RESCORE_QUERIES = 64  # queries per block of the rescore: bounds its (q, W, D) gather
SMALL_INDEX_MAX_ROWS = {"bf16": 12_288, "int8": 6_144}
SMALL_INDEX_MIN_QUERIES = 128


def matmul_is_exact(device: torch.device) -> bool:
    """Whether fp32 products on ``device`` are full fp32 here: an application may lower torch's
    fp32 matmul precision process-wide (``torch.set_float32_matmul_precision("high")`` or
    "medium", ``allow_tf32``), after which they run in TF32 or bf16, with errors near 1e-3 on
    unit vectors, enough to move a score across the threshold."""
    if torch.get_float32_matmul_precision() != "highest":
        return False
    return not (device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)


def exact_dots(candidates: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """(Q, W) fp32 dot products of each query with its (Q, W, D) candidates, by elementwise
    products and a sum: no matmul, so no reduced-precision setting reaches them."""
    return (candidates * queries[:, None, :]).sum(dim=2)


def overfetch(k: int) -> int:
    """Candidates a quantized scan keeps for the full-precision rescore of its top ``k``."""
    return 4 * k + 16


@dataclass(frozen=True)
class RefinePolicy:
    """When a quantized CPU index answers a batch from its exact copy instead."""

    small_index_rows: Mapping[str, int] = field(default_factory=lambda: dict(SMALL_INDEX_MAX_ROWS))
    min_queries: int = SMALL_INDEX_MIN_QUERIES

    def scans_copy(self, mode: str, on_cpu: bool, torch_kernel: bool, q: int, rows: int) -> bool:
        if not on_cpu or q <= 1 or not torch_kernel:
            return False
        if mode == "fp16":
            return True
        return q >= self.min_queries and rows <= self.small_index_rows.get(mode, 0)


class FullCopy:
    """The fp32 copy of a quantized index's rows, in host memory."""

    def __init__(self, dim: int, rows: int) -> None:
        self.dim = dim
        self.data = torch.zeros((rows, dim), dtype=torch.float32)  # (N_alloc, D)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def grow(self, extra: int) -> None:
        self.data = torch.cat([self.data, self.data.new_zeros((extra, self.dim))])

    def write(self, rows: Sequence[int], vectors: torch.Tensor) -> None:
        self.data[torch.tensor(list(rows), dtype=torch.int64)] = vectors.to("cpu", torch.float32)

    def gather(self, rows: Sequence[int]) -> torch.Tensor:
        return self.data[torch.tensor(list(rows), dtype=torch.int64)]

    def rescore(self, queries: torch.Tensor, rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact fp32 scores of the candidate ``rows`` (Q, W) from the copy; their top ``k``, as
        ``(scores, rows)`` (Q, K) on the host, padded with ``-inf`` / ``-1``."""
        return rescore_rows(self.data, queries, rows, k)


def rescore_rows(
    vectors: torch.Tensor, queries: torch.Tensor, rows: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact fp32 scores of candidate ``rows`` (Q, W, -1 padded) of fp32 ``vectors``, on the
    vectors' device; their top ``k`` as ``(scores, rows)``, (Q, K), padded with ``-inf`` / ``-1``."""
    device = vectors.device
    rows = rows.to(device)  # (Q, W)
    valid = rows >= 0
    picked_rows = rows.clamp(min=0)
    queries = queries.to(device, torch.float32)
    exact = torch.empty(rows.shape, dtype=torch.float32, device=device)  # (Q, W)
    # RESCORE_QUERIES at a time: a fresh (Q, W, D) block for a large batch costs more in page
    # faults than its products; blocks of this size the allocator reuses
    for start in range(0, rows.shape[0], RESCORE_QUERIES):
        stop = start + RESCORE_QUERIES
        exact[start:stop] = exact_dots(vectors[picked_rows[start:stop]], queries[start:stop])  # (q, W)
    exact.masked_fill_(~valid, -math.inf)
    kk = min(k, exact.shape[1])
    top, pick = exact.topk(kk, dim=1)  # (Q, kk)
    picked = rows.gather(1, pick)  # (Q, kk)
    if kk < k:  # pad to (Q, K)
        top = torch.cat([top, top.new_full((top.shape[0], k - kk), -math.inf)], dim=1)
        picked = torch.cat([picked, picked.new_full((picked.shape[0], k - kk), -1)], dim=1)
    picked.masked_fill_(top == -math.inf, -1)
    return top, picked
