"""Top-k of a wide score block by way of block maxima.

Why: the scan's score blocks are wide (Q queries x tens of thousands of rows) and K is small (1
to a few dozen). ``torch.topk`` along a wide row on the CPU costs a sizeable fraction of the
matmul that produced the row. A maximum over blocks of 64 columns is a plain streaming
reduction, several times cheaper (``bench/reports/performance-notes.md``, "Top-k"), and the
top K columns always lie in the K blocks with the
largest maxima: a block holding one of the top K has a maximum at least that large, and fewer
than K blocks can hold a larger element. So the exact top K is found by a topk over the block
maxima, then a topk over the K x 64 columns of the chosen blocks.

Ties may be broken differently from ``torch.topk``; the values returned are the same.
"""

from __future__ import annotations

import math

import numpy as np
import torch

BLOCK = 64
# Below this many scores the plain topk is already cheap and the gathers are not (counted in
# scores, not queries: one query over 1M rows gains, one over 10k rows loses).
MIN_SCORES = 65_536


def block_topk(scores: torch.Tensor, k: int, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores.topk(k, dim=1)`` for a 2-D ``(Q, C)`` block, with k <= C.

    Returns ``(values, columns)``, both ``(Q, k)``, values in descending order.
    """
    q, c = scores.shape
    if not 1 <= k <= c:
        raise ValueError(f"k must be in [1, {c}], got {k}")
    blocks = c // block
    if q * c < MIN_SCORES or blocks <= k or not scores.is_contiguous():
        return scores.topk(k, dim=1)
    maxima = scores[:, : blocks * block].reshape(q, blocks, block).amax(dim=2)  # (Q, C // B)
    _, best_blocks = maxima.topk(k, dim=1)  # (Q, k)
    offsets = torch.arange(block, device=scores.device)  # (B,)
    columns = (best_blocks[:, :, None] * block + offsets).reshape(q, k * block)  # (Q, k * B)
    if blocks * block < c:  # the ragged tail is always a candidate
        tail = torch.arange(blocks * block, c, device=scores.device).expand(q, -1)
        columns = torch.cat([columns, tail], dim=1)
    values, picked = scores.gather(1, columns).topk(k, dim=1)  # (Q, k)
    return values, columns.gather(1, picked)


def block_topk_rows(scores: torch.Tensor, k: int, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_topk`` for a torch block laid out rows-first, ``(C, Q)`` and contiguous (the
    layout a CPU product of C rows by Q queries is fastest in, ``torch_engine.rows_first``).
    Returns ``(values,
    rows)``, both ``(Q, k)``, values in descending order.

    Block g is rows [gB, gB + B): its maxima are a reduction over the middle axis of a
    ``(G, B, Q)`` view, which runs along contiguous rows of Q values."""
    c, q = scores.shape
    if not 1 <= k <= c:
        raise ValueError(f"k must be in [1, {c}], got {k}")
    blocks = c // block
    if q * c < MIN_SCORES or blocks <= k or not scores.is_contiguous():
        values, rows = scores.topk(k, dim=0)  # (k, Q)
        return values.T.contiguous(), rows.T.contiguous()
    maxima = scores[: blocks * block].view(blocks, block, q).amax(dim=1)  # (G, Q)
    _, best = maxima.topk(k, dim=0)  # (k, Q)
    offsets = torch.arange(block, device=scores.device)
    rows = (best[:, None, :] * block + offsets[None, :, None]).reshape(k * block, q)
    if blocks * block < c:  # the ragged tail is always a candidate
        tail = torch.arange(blocks * block, c, device=scores.device)[:, None].expand(-1, q)
        rows = torch.cat([rows, tail], dim=0)
    values, picked = scores.gather(0, rows).topk(k, dim=0)  # (k, Q)
    return values.T.contiguous(), rows.gather(0, picked).T.contiguous()


def block_topk_numpy(scores: np.ndarray, k: int, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``block_topk`` for a numpy block laid out rows-first, ``(C, Q)``. Returns ``(values,
    rows)``, both ``(Q, k)``, values in descending order. A ``(Q, C)`` block passed as
    ``scores.T`` is answered correctly but slower than torch's: the numpy engine hands those
    to ``block_topk``.

    Why a numpy twin: on a CPU whose fp32 scan multiplies through numpy's BLAS, following the
    product with torch reductions hands the cores back and forth between two thread pools,
    and torch's OpenMP threads spin while BLAS wants the cores. Staying in numpy keeps one
    pool. Rows-first because BLAS computes (C, D) x (D, Q) faster than (Q, D) x (D, C) for
    small Q.

    The blocks interleave here: block g holds rows g, g + G, g + 2G, ... (G blocks), so that the
    maxima are element-wise maxima of contiguous (G, Q) slabs, which numpy vectorises; a
    reduction along a short last axis runs a slow generic loop. The argument of the module
    docstring holds for any partition. (Figures: ``bench/reports/performance-notes.md``.)
    """
    c, q = scores.shape
    if not 1 <= k <= c:
        raise ValueError(f"k must be in [1, {c}], got {k}")
    groups = c // block
    if groups > k:
        maxima = scores[: block * groups].reshape(block, groups, q).max(axis=0)  # (G, Q)
        best = np.argpartition(maxima, groups - k, axis=0)[groups - k :]  # (k, Q)
        rows = (np.arange(block)[:, None, None] * groups + best[None]).reshape(block * k, q)
        if block * groups < c:  # the ragged tail is always a candidate
            tail = np.broadcast_to(np.arange(block * groups, c)[:, None], (c - block * groups, q))
            rows = np.concatenate([rows, tail], axis=0)
    else:
        rows = np.broadcast_to(np.arange(c)[:, None], (c, q))
    candidates = np.take_along_axis(scores, rows, axis=0)  # (W, Q)
    width = candidates.shape[0]
    top = np.argpartition(candidates, width - k, axis=0)[width - k :]  # (k, Q), unordered
    top_values = np.take_along_axis(candidates, top, axis=0)
    order = np.argsort(-top_values, axis=0, kind="stable")  # descending
    values = np.take_along_axis(top_values, order, axis=0).T  # (Q, k)
    picked = np.take_along_axis(np.take_along_axis(rows, top, axis=0), order, axis=0).T
    return np.ascontiguousarray(values), np.ascontiguousarray(picked)


# The value a masked (dead) int8 product is set to: below any real one (|dot| <= D x 127^2).
INT32_MASKED = -(2**31)


def block_topk_scaled(
    dots: torch.Tensor, block_scales: torch.Tensor, k: int, block: int = BLOCK, masked: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_topk`` of ``dots * scale`` for int32 ``(Q, C)`` products whose columns share one
    scale per block of ``block`` columns: column ``j`` is scaled by ``block_scales[j // block]``
    (``block_scales`` has ``ceil(C / block)`` entries). Entries equal to ``INT32_MASKED`` are
    masked: ``-inf`` if they have to be returned at all; ``masked=False`` says there are none
    (two passes over the candidates fewer).

    Returns ``(values, columns)``, float32 values, both ``(Q, k)``, values in descending order.

    Why: the int8 store scans int32 products, and widening a whole (Q, C) block to scaled
    float32 scores costs a pass as long as the top-k itself. With one scale per block, a
    block's largest score is its largest product times its scale, so the block maxima are taken
    on the int32 products and only the chosen blocks are widened; the argument of the module
    docstring is unchanged.
    """
    q, c = dots.shape
    if not 1 <= k <= c:
        raise ValueError(f"k must be in [1, {c}], got {k}")
    blocks = c // block
    if block_scales.shape != ((c + block - 1) // block,):
        raise ValueError(
            f"{c} columns need {(c + block - 1) // block} block scales, got {tuple(block_scales.shape)}"
        )
    if q * c < MIN_SCORES or blocks <= k or not dots.is_contiguous():
        scores = _widen(dots, block_scales.repeat_interleave(block)[:c], masked)
        return scores.topk(k, dim=1)
    body = dots[:, : blocks * block].view(q, blocks, block)  # (Q, G, B)
    # a block with every product masked ranks last whatever its scale: scaled, the sentinel is
    # only as low as the scale makes it (beside a tiny scale it could outrank a live block)
    maxima = _widen(body.amax(dim=2), block_scales[:blocks], masked)  # (Q, G)
    _, best = maxima.topk(k, dim=1)  # (Q, k) blocks
    # the chosen blocks' products, copied block by block, then widened and scaled
    chosen = body[torch.arange(q, device=dots.device)[:, None], best]  # (Q, k, B)
    values = _widen(chosen, block_scales[best][:, :, None], masked).reshape(q, k * block)
    if blocks * block < c:  # the ragged tail is always a candidate
        tail = _widen(dots[:, blocks * block :], block_scales[blocks], masked)
        values = torch.cat([values, tail], dim=1)
    top, picked = values.topk(k, dim=1)  # (Q, k) positions among the candidates
    in_block = picked < k * block
    block_pos = torch.where(in_block, picked, 0)
    columns = torch.where(
        in_block,
        best.gather(1, block_pos // block) * block + block_pos % block,
        picked - k * block + blocks * block,
    )
    return top, columns


def _widen(dots: torch.Tensor, scale: torch.Tensor, masked: bool) -> torch.Tensor:
    """float32 ``dots * scale``, with masked products at ``-inf``."""
    scores = dots.float().mul_(scale)
    return scores.masked_fill_(dots == INT32_MASKED, -math.inf) if masked else scores


class RunningTopK:
    """The best ``k`` (score, row) pairs per query over a scan's chunks, merged as each chunk's
    own top-k arrives (FAISS's ``ResultHeap``, for torch tensors)."""

    def __init__(self, q: int, k: int, high: int, device: torch.device) -> None:
        self.k, self.high = k, high
        self.scores = torch.full((q, k), -math.inf, dtype=torch.float32, device=device)  # (Q, K)
        self.rows = torch.full((q, k), -1, dtype=torch.int64, device=device)  # (Q, K)

    def add(self, top: torch.Tensor, columns: torch.Tensor, start: int, stop: int) -> bool:
        """Merge chunk ``[start, stop)``'s top ``(Q, k')`` at ``columns`` of the chunk; True when
        that chunk was the whole scan (its top-k is the answer, no merge to pay for)."""
        if start == 0 and stop == self.high and top.shape[1] == self.k:
            self.scores, self.rows = top.float(), columns
            return True
        merged_scores = torch.cat([self.scores, top.float()], dim=1)  # (Q, K + k')
        merged_rows = torch.cat([self.rows, columns + start], dim=1)  # (Q, K + k')
        self.scores, pick = merged_scores.topk(self.k, dim=1)  # (Q, K)
        self.rows = merged_rows.gather(1, pick)  # (Q, K)
        return False

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores, rows)``, ``(Q, K)`` each, rows -1 where no live row filled a place."""
        self.rows.masked_fill_(self.scores == -math.inf, -1)
        return self.scores, self.rows


def chunk_topk(
    scores: torch.Tensor, dead: torch.Tensor, any_dead: bool, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top ``k`` of one chunk's ``(Q, C)`` scores with its dead rows masked, both ``(Q, k)``.
    A product laid out rows-first (``scores.T`` contiguous, Q > 1) is reduced in that layout
    (``block_topk_rows``), saving a transpose as long as the product."""
    if scores.shape[0] > 1 and scores.T.is_contiguous():
        if any_dead:
            scores.T.masked_fill_(dead[:, None], -math.inf)  # broadcast over queries
        return block_topk_rows(scores.T, k)
    if any_dead:
        scores.masked_fill_(dead, -math.inf)  # broadcast over queries
    return block_topk(scores, k)
