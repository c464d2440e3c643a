"""Fused similarity scan + top-k: the (Q, N) score matrix never goes to memory.

Why: an exact-scan store's cost is one pass over its N rows per batch of Q queries. The torch
path computes a (Q, chunk) score block with a matmul, writes it to memory, masks it, and runs
``topk`` over it: at Q = 1024 and N = 1M that is 4 GB of scores written and read again. This
kernel keeps each (BLOCK_Q, BLOCK_N) tile of scores in registers, masks dead rows (other
scopes, expired, free) there, and writes only the tile's best K per query. A second, tiny
``topk`` over the (Q, N / BLOCK_N * K) survivors gives the answer. Memory traffic is the
vectors read once per query block plus the survivors, instead of vectors plus 2 x Q x N x 4
bytes of scores.

Top-k inside the tile is K rounds of (max, argmax, knock out): K is small (the cache asks for
top_k candidates, 1 to 16), and this needs no sort network.

Liveness (scope and expiry) is computed by the caller as one (N,) bool tensor: expiry times are
float64 seconds since the epoch, which a float32 kernel argument would round to minutes.

Precision: fp32 inputs use ``input_precision="ieee"`` (not TF32), because for an fp32 store the
scores this returns are the similarities the threshold sees. fp16/bf16 inputs accumulate in
fp32; the store rescores their candidates in fp32 anyway.

Anatomy (Triton tutorial 03): this explanation; ``_scan_topk_kernel``; ``scan_topk``, which
checks, allocates and launches; ``scan_topk_ref``, the plain-torch reference that is both the
fallback and the test oracle. Tolerance against the reference: 1e-5 absolute for fp32 (same
products, another summation order), and ties may pick different rows with equal scores.
"""

from __future__ import annotations

import math

import torch

try:  # Triton is optional (the ``kernels`` extra); the reference runs everywhere
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

MAX_K = 64


def scan_topk_ref(
    queries: torch.Tensor, vectors: torch.Tensor, live: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` dot products over live rows: ``(scores, rows)`` of shape (Q, K), best first,
    padded with ``-inf`` / ``-1``. Plain torch: the fallback and the oracle."""
    scores = queries.float() @ vectors.float().T  # (Q, D) @ (D, N) -> (Q, N)
    scores.masked_fill_(~live, -math.inf)  # (Q, N), broadcast over queries
    kk = min(k, scores.shape[1])
    top, rows = scores.topk(kk, dim=1)  # (Q, kk)
    return _pad(top, rows, k)


def _pad(top: torch.Tensor, rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    q, kk = top.shape
    if kk < k:
        top = torch.cat([top, top.new_full((q, k - kk), -math.inf)], dim=1)
        rows = torch.cat([rows, rows.new_full((q, k - kk), -1)], dim=1)
    rows = rows.masked_fill(top == -math.inf, -1)
    return top, rows


if triton is not None:

    @triton.jit
    def _scan_topk_kernel(
        q_ptr,
        v_ptr,
        live_ptr,
        out_scores_ptr,
        out_rows_ptr,
        Q,
        N,
        D,
        stride_q,
        stride_v,
        n_blocks,
        BLOCK_Q: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        K: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        pid_q = tl.program_id(0)
        pid_n = tl.program_id(1)
        rq = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)  # (BQ,)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
        acc = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            rd = d0 + tl.arange(0, BLOCK_D)
            qt = tl.load(
                q_ptr + rq[:, None] * stride_q + rd[None, :],
                mask=(rq[:, None] < Q) & (rd[None, :] < D),
                other=0.0,
            )  # (BQ, BD)
            vt = tl.load(
                v_ptr + rn[:, None] * stride_v + rd[None, :],
                mask=(rn[:, None] < N) & (rd[None, :] < D),
                other=0.0,
            )  # (BN, BD)
            if IEEE:
                acc += tl.dot(qt, tl.trans(vt), input_precision="ieee")  # (BQ, BN)
            else:
                acc += tl.dot(qt, tl.trans(vt))  # (BQ, BN)
        live = tl.load(live_ptr + rn, mask=rn < N, other=0)  # (BN,)
        acc = tl.where((live != 0)[None, :], acc, float("-inf"))
        cols = tl.arange(0, BLOCK_N)
        out = (rq * n_blocks + pid_n) * K  # (BQ,) offset of this tile's survivors per query
        for j in tl.static_range(K):
            best = tl.max(acc, axis=1)  # (BQ,)
            where = tl.argmax(acc, axis=1)  # (BQ,)
            tl.store(out_scores_ptr + out + j, best, mask=rq < Q)
            tl.store(out_rows_ptr + out + j, (pid_n * BLOCK_N + where).to(tl.int64), mask=rq < Q)
            acc = tl.where(cols[None, :] == where[:, None], float("-inf"), acc)


def triton_available() -> bool:
    return triton is not None


def scan_topk(
    queries: torch.Tensor,
    vectors: torch.Tensor,
    live: torch.Tensor,
    k: int,
    *,
    block_q: int = 32,
    block_n: int = 128,
    block_d: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused top-``k`` scan: same contract as ``scan_topk_ref``.

    ``queries`` (Q, D) and ``vectors`` (N, D) share a dtype (fp32, fp16 or bf16) and a device;
    ``live`` is (N,) bool. Runs on CUDA, or on the CPU under ``TRITON_INTERPRET=1``.
    """
    if triton is None:
        raise RuntimeError("scan_topk needs triton (pip install 'gpucache[kernels]')")
    if queries.ndim != 2 or vectors.ndim != 2 or queries.shape[1] != vectors.shape[1]:
        raise ValueError(
            f"queries (Q, D) and vectors (N, D) must share D, got "
            f"{tuple(queries.shape)} and {tuple(vectors.shape)}"
        )
    if live.shape != (vectors.shape[0],) or live.dtype != torch.bool:
        raise ValueError(f"live must be a ({vectors.shape[0]},) bool tensor")
    if queries.dtype != vectors.dtype or queries.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(
            f"queries and vectors must share fp32/fp16/bf16, got {queries.dtype} and {vectors.dtype}"
        )
    if not (queries.device == vectors.device == live.device):
        raise ValueError("queries, vectors and live must be on one device")
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"k must be an int in [1, {MAX_K}], got {k!r}")
    q, n, d = queries.shape[0], vectors.shape[0], queries.shape[1]
    if q == 0 or n == 0:
        empty = torch.empty((q, 0), dtype=torch.float32, device=queries.device)
        return _pad(empty, empty.long(), k)
    queries, vectors = queries.contiguous(), vectors.contiguous()
    kk = min(k, block_n)
    n_blocks = triton.cdiv(n, block_n)
    scores = torch.empty((q, n_blocks * kk), dtype=torch.float32, device=queries.device)
    rows = torch.empty((q, n_blocks * kk), dtype=torch.int64, device=queries.device)
    grid = (triton.cdiv(q, block_q), n_blocks)
    _scan_topk_kernel[grid](
        queries,
        vectors,
        live.to(torch.int8),
        scores,
        rows,
        q,
        n,
        d,
        queries.stride(0),
        vectors.stride(0),
        n_blocks,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        K=kk,
        IEEE=queries.dtype == torch.float32,
    )
    top, pick = scores.topk(min(k, scores.shape[1]), dim=1)  # (Q, K) over the survivors
    return _pad(top, rows.gather(1, pick), k)
