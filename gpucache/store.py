"""Exact-scan vector store: every stored row is scored against every query.

Shape vocabulary, used on every tensor line in gpucache:
    Q  queries in a batch          N  stored rows (the high-water mark of used slots)
    D  embedding dimension         K  candidates kept per query

Why an exact scan rather than an approximate index: a semantic cache must be able to say
"nothing stored is close enough", and an approximate index can only say "nothing I looked at
is". At the sizes a response cache reaches (1e4..1e6 rows) a dense matmul over the whole store
is also fast on a GPU and tolerable on a CPU, and it needs no training or rebuild.

Memory: the vectors live in one preallocated ``(capacity_alloc, D)`` device tensor that doubles
as it fills (amortised O(1) adds), with a scope id and an expiry time per row beside it. A
free row has scope id -1, so masking by scope also masks free rows. The scan walks the rows in
chunks so the ``(Q, chunk)`` score block never exceeds ``scan_budget_bytes``, and keeps a running
top-K, so a million rows can be scanned with a few megabytes of scratch. Each block's top-K goes
through its block maxima (``gpucache.topk``), and the scope/expiry mask is applied only to a
block that has a dead row: on the CPU both passes used to cost as much as the matmul.

On a CPU, fp16 storage answers batches (Q > 1) from its fp32 host copy, which sits in the same
memory: x86 has no fast fp16 matmul, and a single query's fp16 scan is still the faster one.

Quantized storage (``quantization=``) keeps the device copy in fp16, bf16 or int8 (an fp32
scale per row, shared by each block of ``INT8_SCALE_BLOCK`` rows: see there why) to save device
memory and bandwidth, and a full-precision fp32 copy in host memory. The quantized scan
over-fetches candidates (``4K + 16``), which are then rescored in full precision, so the scores
the cache sees are exact: quantization can only cost a miss (a true best row that the quantized
scan ranked below the over-fetch), never cause a hit.

    mode    device bytes per row      host bytes per row
    fp32    4D + 16                   0
    fp16    2D + 16                   4D
    bf16    2D + 16                   4D
    int8    D + 20 (scale)            4D

(the 16 are the scope id and the expiry time; D = 384 for MiniLM: 1552, 784, 784, 404 bytes.)
``max_device_bytes`` caps the allocation; the store then holds at most ``max_rows`` rows and the
cache evicts to stay within them.

The store is mechanism only: it never decides what to keep. The cache decides which row to
evict and tells the store to ``remove`` it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from gpucache.blas_pool import BLAS_POOL_QUIET
from gpucache.devices import DeviceLike, cpu_vendor, resolve_device
from gpucache.kernel_choice import ScanKernelChooser
from gpucache.scratch import BufferSource, ScanScratch
from gpucache.topk import (
    BLOCK,
    INT32_MASKED,
    block_topk,
    block_topk_numpy,
    block_topk_rows,
    block_topk_scaled,
)

FREE = -1
NEVER = math.inf
MIN_SCAN_ROWS = 256  # below this a smaller chunk saves too little memory to be worth a retry
QUANTIZATIONS = ("fp32", "fp16", "bf16", "int8")
_STORAGE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
            "int8": torch.int8}


# torch's CPU builds use MKL, which takes slow generic code paths on AMD processors: on this
# project's 2-core AMD EPYC an fp32 (1, 384) x (384, 1M) product took 193 ms in torch and 69 ms
# through numpy's OpenBLAS, and (1024, 384) x (384, 100k) 559 ms against 415 ms (the bench
# report measures both). On AMD CPUs the fp32 scan therefore multiplies through numpy, on the
# same memory (torch.from_numpy shares it), provided OpenBLAS's threads sleep when idle (see
# blas_pool.py: spinning, they slowed the next embedding by half); elsewhere it stays in torch.
FP32_MATMUL_VIA_NUMPY = cpu_vendor() == "AuthenticAMD" and BLAS_POOL_QUIET


# Up to this many queries, BLAS answers (C, D) x (D, Q) faster than (Q, D) x (D, C) (FAISS
# multiplies this way round too): 100k rows, Q = 16: 22 ms against 32; Q = 64: 40 against 48;
# Q = 256: 115 against 126. Beyond it the queries-first product was as fast or faster.
ROWS_FIRST_MAX_QUERIES = 256
# torch's CPU products are rows-first too: fp32 up to ROWS_FIRST_MAX_QUERIES (whole scans of
# 100k rows, paired: Q = 2 in 6.5 ms against 38, 64 in 42 against 51, 256 in 128 against 150),
# bf16 only in this range of Q, where oneDNN's kernel for that shape is the faster one (100k
# rows: Q = 64 in 18 ms against 25, 128 in 35 against 40; 1M rows, Q = 64: 155 against 196;
# but Q = 24-48 and 192-256 were 3-30% slower rows-first).
BF16_ROWS_FIRST_QUERIES = (64, 128)
# A bf16/int8 CPU store this small answers a batch this large from its exact fp32 copy: every
# query of a quantized scan pays an over-fetch and a rescore, which here outweighs the faster
# product. Measured with the scan's buffers kept between scans (``gpucache.scratch``), 1024
# queries: bf16 at 12k rows 59.9 ms against 59.5 from the copy, at 5k 45.1 against 28.8; int8 at
# 7k 35.9 against 37.7, at 5k 31.2 against 28.9 (the int8 product is the faster one). At 64
# queries the quantized scan is the faster at every size. See ``_scans_full_copy``.
SMALL_STORE_MAX_ROWS = {"bf16": 12_288, "int8": 6_144}
SMALL_STORE_MIN_QUERIES = 128
# int8 rows share one scale per block of this many consecutive rows (the top-k's block), so the
# scan takes block maxima on the int32 products (``block_topk_scaled``) and widens only the
# chosen blocks. Whole scans, paired with per-row scales: 100k rows x 64 queries 14.1 ms
# against 16.6, 100k x 1024 224 against 271, 1M x 64 97 against 113. The cost is precision for
# rows smaller than their block's largest, which the over-fetch and the fp32 rescore absorb: on
# MiniLM embeddings (banking77, row maxima 0.12-0.28) the mean int8 score error went from
# 4.3e-4 to 5.1e-4, and the worst rank of a true top-4 row among the int8 scores stayed 5 (the
# over-fetch keeps 32); recall stays 1.0 in the bench.
INT8_SCALE_BLOCK = BLOCK


def _int8_matmul_works() -> bool:
    """torch._int_mm (a private op, CPU support since torch 2.2) on a tiny case."""
    try:
        a = torch.ones((1, 8), dtype=torch.int8)
        return int(torch._int_mm(a, torch.ones((8, 3), dtype=torch.int8).T.T)[0, 0]) == 8
    except (RuntimeError, AttributeError, TypeError):
        return False


INT8_MATMUL = _int8_matmul_works()


def _int8_gemv_works() -> bool:
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


# A single query against int8 rows: a GEMV that streams the rows once (1M x 384 rows in
# 15.5 ms here, 25 GB/s, against 21.5 ms through torch._int_mm), scales applied in the same pass.
# Only for dimensions in multiples of INT8_GEMV_DIM: torch 2.13's CPU kernel checks no shape and
# returned wrong sums for others (24, 33, 385), or crashed the process (1, 3, 7 with 5 rows).
INT8_GEMV = _int8_gemv_works()
INT8_GEMV_DIM = 16


def _triton_importable() -> bool:
    """Whether the fused kernel can run; imported only for CUDA stores (importing Triton
    takes a while, and a CPU store never uses it unasked)."""
    from gpucache.kernels import triton_available

    return triton_available()


RESCORE_QUERIES = 64  # queries per block of the full-precision rescore


def overfetch(k: int) -> int:
    """Candidates a quantized scan keeps for the full-precision rescore of its top ``k``."""
    return 4 * k + 16


class ExactScanStore:
    """Rows of unit vectors with a scope and an expiry each, searched by exact dot product.

    Args:
        dim: embedding dimension D.
        device: where the vectors live ("auto", "cpu", "cuda[:N]").
        initial_rows: rows allocated up front; the tensor doubles when it fills.
        scan_budget_bytes: the most memory one (Q, chunk) fp32 score block may take.
        quantization: None or "fp32" (full precision on the device), "fp16", "bf16" or "int8".
        max_device_bytes: the most device memory the store's tensors may take; None: no cap.
        scan_kernel: "auto", "torch" (chunked matmul + topk) or "triton" (the fused kernel
            of ``gpucache.kernels``; fp32/fp16/bf16 storage, CUDA or Triton's CPU interpreter).
            "auto" times both on this store's own scans on CUDA when Triton is installed and
            keeps the faster per shape (``ScanKernelChooser``); elsewhere it is "torch".
    """

    def __init__(
        self,
        dim: int,
        *,
        device: DeviceLike = "auto",
        initial_rows: int = 1024,
        scan_budget_bytes: int = 64 * 2**20,
        quantization: str | None = None,
        max_device_bytes: int | None = None,
        scan_kernel: str = "auto",
    ) -> None:
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if not isinstance(initial_rows, int) or initial_rows < 1:
            raise ValueError(f"initial_rows must be an int >= 1, got {initial_rows!r}")
        if not isinstance(scan_budget_bytes, int) or scan_budget_bytes < 4:
            raise ValueError(f"scan_budget_bytes must be an int >= 4, got {scan_budget_bytes!r}")
        mode = "fp32" if quantization is None else quantization
        if mode not in QUANTIZATIONS:
            raise ValueError(f"quantization must be None or one of {QUANTIZATIONS}, got {quantization!r}")
        if scan_kernel not in ("auto", "torch", "triton"):
            raise ValueError(
                f"scan_kernel must be 'auto', 'torch' or 'triton', got {scan_kernel!r}"
            )
        if scan_kernel == "triton":
            from gpucache.kernels import triton_available

            if not triton_available():
                raise ValueError("scan_kernel='triton' needs triton: pip install 'gpucache[kernels]'")
            if mode == "int8":
                raise ValueError("scan_kernel='triton' supports fp32, fp16 and bf16 storage")
        self.dim = dim
        self.device = resolve_device(device)
        self.kernel_chooser: ScanKernelChooser | None = None
        if scan_kernel == "auto":
            if self.device.type == "cuda" and mode != "int8" and _triton_importable():
                self.kernel_chooser = ScanKernelChooser(self.device)
            else:
                scan_kernel = "torch"  # nothing to choose between: said so in the attribute
        self.scan_kernel = scan_kernel
        self.scan_budget_bytes = scan_budget_bytes
        self.quantization = mode
        self._dtype = _STORAGE[mode]
        self.row_bytes = dim * torch.empty((), dtype=self._dtype).element_size() + 16 + (
            4 if mode == "int8" else 0
        )
        if max_device_bytes is None:
            self.max_rows: int | None = None
        else:
            if isinstance(max_device_bytes, bool) or not isinstance(max_device_bytes, int) or (
                max_device_bytes < self.row_bytes
            ):
                raise ValueError(
                    f"max_device_bytes must be an int >= {self.row_bytes} (one row), "
                    f"got {max_device_bytes!r}"
                )
            self.max_rows = max_device_bytes // self.row_bytes
            initial_rows = min(initial_rows, self.max_rows)
        self.max_device_bytes = max_device_bytes
        self._vectors = torch.zeros((initial_rows, dim), dtype=self._dtype, device=self.device)
        self._scales = torch.ones(initial_rows if mode == "int8" else 0, device=self.device)
        # full-precision host copy for the rescore (quantized modes only)
        self._full = torch.zeros((initial_rows if mode != "fp32" else 0, dim), dtype=torch.float32)
        self._scopes = torch.full((initial_rows,), FREE, dtype=torch.int64, device=self.device)
        self._expires = torch.full((initial_rows,), NEVER, dtype=torch.float64, device=self.device)
        self._free: list[int] = []  # freed rows below the high-water mark, reused first
        self._high = 0  # rows [0, high) have been used at least once
        self._count = 0
        self.scan_retries = 0  # scans retried in smaller chunks after running out of memory
        self.cpu_fallbacks = 0  # scans that ran on the CPU because the device ran out of memory
        self._falling_back = False
        self.scratch = ScanScratch()  # a CPU scan's product buffers, kept between scans

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Device bytes held by the allocated tensors (used and spare rows)."""
        return sum(
            t.numel() * t.element_size()
            for t in (self._vectors, self._scales, self._scopes, self._expires)
        )

    @property
    def host_nbytes(self) -> int:
        """Host bytes held by the full-precision copy (quantized modes only)."""
        return self._full.numel() * self._full.element_size()

    def add(self, vectors: torch.Tensor, scope_id: int, expires_at: Sequence[float]) -> list[int]:
        """Store (M, D) vectors in ``scope_id``; returns the M row numbers they took."""
        m = vectors.shape[0]
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape (M, {self.dim}), got {tuple(vectors.shape)}")
        if len(expires_at) != m:
            raise ValueError(f"expires_at has {len(expires_at)} entries for {m} vectors")
        if scope_id < 0:
            raise ValueError(f"scope_id must be >= 0, got {scope_id}")
        rows = self._take_rows(m)
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        full = vectors.to(self.device, torch.float32)
        if self.quantization != "fp32":
            self._full[torch.tensor(rows, dtype=torch.int64)] = full.cpu()
        self._scopes[index] = scope_id
        self._expires[index] = torch.tensor(list(expires_at), dtype=torch.float64).to(self.device)
        if self.quantization == "int8":
            self._quantize_blocks(rows)
        else:
            self._vectors[index] = full.to(self._dtype)
        self._count += m
        return rows

    def _quantize_blocks(self, rows: Sequence[int]) -> None:
        """Quantize the blocks of ``INT8_SCALE_BLOCK`` rows that hold ``rows`` from the fp32
        copy, each with one scale: its live rows' largest magnitude / 127. A new row larger
        than its block's scale re-quantizes the block's other rows with it; a block whose
        largest row left gets a finer scale the next time a row joins it."""
        size, capacity = INT8_SCALE_BLOCK, self._vectors.shape[0]
        blocks = torch.tensor(sorted({r // size for r in rows}), dtype=torch.int64)  # (B,)
        members = blocks[:, None] * size + torch.arange(size)  # (B, S) row numbers
        exists = members < capacity  # the last block may be cut short by the capacity
        members = members.clamp(max=capacity - 1)
        full = self._full[members]  # (B, S, D)
        live = (self._scopes[members.to(self.device)].cpu() != FREE) & exists  # (B, S)
        magnitude = full.abs().amax(dim=2).masked_fill_(~live, 0.0)  # (B, S)
        scales = magnitude.amax(dim=1).clamp(min=1e-12) / 127.0  # (B,)
        quantized = (full / scales[:, None, None]).round().clamp(-127, 127).to(torch.int8)
        targets = members[exists].to(self.device)
        self._vectors[targets] = quantized[exists].to(self.device)
        self._scales[targets] = scales[:, None].expand(-1, size)[exists].to(self.device)

    def remove(self, rows: Sequence[int]) -> None:
        """Free ``rows``; a removed row can never be returned by ``search`` again."""
        if not rows:
            return
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        if bool((self._scopes[index] == FREE).any()):
            raise RuntimeError("gpucache bug: removing a row that is not in use")
        self._scopes[index] = FREE
        self._expires[index] = NEVER
        self._free.extend(rows)
        self._count -= len(rows)

    def set_expiry(self, rows: Sequence[int], expires_at: Sequence[float]) -> None:
        """Give stored ``rows`` new expiry times (seconds on the cache's clock, inf = never)."""
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        self._expires[index] = torch.tensor(list(expires_at), dtype=torch.float64).to(self.device)

    def expired_rows(self, now: float) -> list[int]:
        """Rows in use whose expiry is at or before ``now``: one vectorised pass, one transfer."""
        live = self._scopes[: self._high] != FREE
        dead = live & (self._expires[: self._high] <= now)
        return dead.nonzero().flatten().tolist()

    def clear(self) -> None:
        self._scopes[: self._high] = FREE
        self._expires[: self._high] = NEVER
        self._free.clear()
        self._high = 0
        self._count = 0
        self.scratch.release()

    def vectors(self, rows: Sequence[int]) -> torch.Tensor:
        """(M, D) full-precision copies of stored rows (for persistence): fp32, on the device
        for fp32 storage, on the host for quantized storage."""
        if self.quantization != "fp32":
            return self._full[torch.tensor(list(rows), dtype=torch.int64)]
        return self._vectors[torch.tensor(list(rows), dtype=torch.int64, device=self.device)]

    def search(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float = -math.inf
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` rows by dot product among live rows of ``scope_id``, per query.

        Returns ``(scores, rows)``, both ``(Q, K)``, best first, padded with ``-inf`` / ``-1``
        where fewer than ``k`` rows qualify. Rows whose expiry is at or before ``now`` and rows
        of other scopes are masked inside the scan, never filtered afterwards in Python.
        """
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (Q, {self.dim}), got {tuple(queries.shape)}")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        q = queries.shape[0]
        if q == 0 or self._count == 0:
            return (
                torch.full((q, k), -math.inf, dtype=torch.float32, device=self.device),
                torch.full((q, k), -1, dtype=torch.int64, device=self.device),
            )
        if self.quantization != "fp32" and not self._scans_full_copy(q):
            wide = min(overfetch(k), max(self._high, 1))
            _, rows = self._search(queries, wide, scope_id, now)  # (Q, wide) by quantized score
            return self._rescore(queries, rows, k)
        return self._search(queries, k, scope_id, now)

    def _scans_full_copy(self, q: int) -> bool:
        """Whether a batch of ``q`` queries scans the fp32 host copy instead of the rows.

        x86 CPUs have no fast fp16 matmul (0.4 GFLOP/s here, against 171 in fp32) and widening
        the rows costs more than the product; a CPU store's fp32 copy is in the same memory, so
        an fp16 batch scans that. Its scores are exact, so it needs no over-fetch and no
        rescore either (at 10k rows and Q = 1024 those had cost 2.8x the scan itself).

        bf16 and int8 products are faster than fp32 on the CPU, so those stores scan their rows,
        except a small store asked many queries at once (``SMALL_STORE_MAX_ROWS``,
        ``SMALL_STORE_MIN_QUERIES``), where the per-query over-fetch and rescore cost more than
        the quantized product saves."""
        if self.device.type != "cpu" or q <= 1 or self.scan_kernel != "torch":
            return False
        if self.quantization == "fp16":
            return True
        return (q >= SMALL_STORE_MIN_QUERIES
                and self._high <= SMALL_STORE_MAX_ROWS.get(self.quantization, 0))

    def _rescore(
        self, queries: torch.Tensor, rows: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact fp32 scores for the candidate ``rows`` (Q, W) from the host copy; top ``k``."""
        rows_host = rows.cpu()  # (Q, W)
        valid = rows_host >= 0
        picked_rows = rows_host.clamp(min=0)
        queries_host = queries.to("cpu", torch.float32)
        exact = torch.empty(rows_host.shape, dtype=torch.float32)  # (Q, W)
        # RESCORE_QUERIES at a time: the (Q, W, D) candidate block for 1024 queries is 50 MB,
        # and a fresh buffer that size costs more in page faults than the products (37 ms
        # against 20 in blocks of 64 queries, which the allocator reuses)
        for start in range(0, rows_host.shape[0], RESCORE_QUERIES):
            stop = start + RESCORE_QUERIES
            cand = self._full[picked_rows[start:stop]]  # (q, W, D)
            exact[start:stop] = torch.einsum("qwd,qd->qw", cand, queries_host[start:stop])
        exact.masked_fill_(~valid, -math.inf)
        kk = min(k, exact.shape[1])
        top, pick = exact.topk(kk, dim=1)  # (Q, kk)
        picked = rows_host.gather(1, pick)  # (Q, kk)
        if kk < k:  # pad to (Q, K)
            top = torch.cat([top, top.new_full((top.shape[0], k - kk), -math.inf)], dim=1)
            picked = torch.cat([picked, picked.new_full((picked.shape[0], k - kk), -1)], dim=1)
        picked.masked_fill_(top == -math.inf, -1)
        return top.to(self.device), picked.to(self.device)

    def _search(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q = queries.shape[0]
        chunk = max(1, min(self._high, self.scan_budget_bytes // (4 * q)))
        vectors = self._full if self._scans_full_copy(q) else self._vectors
        while True:
            try:
                return self._scan(queries.to(self.device, torch.float32), k, scope_id, now, chunk,
                                  vectors, self._scopes, self._expires, self._scales)
            except torch.OutOfMemoryError:
                # The cache shares the device with a model, whose memory use moves: retry with
                # half the scratch, then scan CPU copies rather than fail the lookup.
                if chunk > MIN_SCAN_ROWS:
                    chunk //= 2
                    self.scan_retries += 1
                    continue
                break  # on a CPU store the copies may fail too: then that error propagates
        warnings.warn(
            f"gpucache: {self.device} ran out of memory during the similarity scan; this scan "
            "ran on the CPU", RuntimeWarning, stacklevel=2,
        )
        self.cpu_fallbacks += 1
        self._falling_back = True
        try:
            high = self._high
            scores, rows = self._scan(
                queries.to("cpu", torch.float32), k, scope_id, now, chunk,
                self._vectors[:high].cpu(), self._scopes[:high].cpu(), self._expires[:high].cpu(),
                self._scales[:high].cpu(),
            )
        finally:
            self._falling_back = False
        return scores.to(self.device), rows.to(self.device)

    def _scan(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float, chunk: int,
        vectors: torch.Tensor, scopes: torch.Tensor, expires: torch.Tensor,
        scales: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunked scan with a running top-k over rows [0, high) of the given tensors, with
        the kernel the store was given or, under "auto", the one measured faster here."""
        args = (queries, k, scope_id, now, chunk, vectors, scopes, expires, scales)
        kernel = self.scan_kernel
        if self._falling_back:
            kernel = "torch"
        elif self.kernel_chooser is not None:
            kernel = self.kernel_chooser.choose(
                queries.shape[0], self._high, lambda name: self._scan_with(name, *args)
            )
        return self._scan_with(kernel, *args)

    def _scan_with(
        self, kernel: str, queries: torch.Tensor, k: int, scope_id: int, now: float, chunk: int,
        vectors: torch.Tensor, scopes: torch.Tensor, expires: torch.Tensor,
        scales: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if kernel == "triton":
            from gpucache.kernels import scan_topk

            high = self._high
            live = (scopes[:high] == scope_id) & (expires[:high] > now)  # (N,)
            return scan_topk(queries.to(vectors.dtype), vectors[:high], live, k)
        if FP32_MATMUL_VIA_NUMPY and vectors.dtype == torch.float32 and vectors.device.type == "cpu":
            return self._scan_numpy(queries, k, scope_id, now, chunk, vectors, scopes, expires)
        q, device = queries.shape[0], queries.device
        int8_queries = None
        int8_on_cpu = vectors.dtype == torch.int8 and device.type == "cpu"
        gemv_query = None  # a single query against int8 rows: torch's int8 GEMV
        if int8_on_cpu and q == 1 and INT8_GEMV and self.dim % INT8_GEMV_DIM == 0:
            gemv_query = queries.to(torch.bfloat16)
        elif int8_on_cpu and INT8_MATMUL:
            # int8 x int8 -> int32 on the CPU (oneDNN VNNI): 1M x 384 rows in 31 ms here, where
            # widening the rows to fp32 first took 490 ms. The queries are quantized per row
            # too; the ranking is approximate and the candidates are rescored in fp32 anyway.
            q_scale = queries.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (Q,)
            int8_queries = (queries / q_scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        with self.scratch.lend(keep=not self._falling_back) as buffer:
            return self._scan_torch(q, k, scope_id, now, chunk, queries, vectors, scopes,
                                    expires, scales, int8_queries, gemv_query, buffer)

    def _scan_torch(
        self, q: int, k: int, scope_id: int, now: float, chunk: int, queries: torch.Tensor,
        vectors: torch.Tensor, scopes: torch.Tensor, expires: torch.Tensor, scales: torch.Tensor,
        int8_queries: torch.Tensor | None, gemv_query: torch.Tensor | None, buffer: BufferSource,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = queries.device
        best_scores = torch.full((q, k), -math.inf, dtype=torch.float32, device=device)
        best_rows = torch.full((q, k), -1, dtype=torch.int64, device=device)
        scratch = None
        int8_products = int8_queries is not None
        if int8_products:  # chunks start on a scale block, so each chunk's blocks are whole
            chunk = max(INT8_SCALE_BLOCK, chunk // INT8_SCALE_BLOCK * INT8_SCALE_BLOCK)
        if device.type == "cpu" and q > 1 and (vectors.dtype != torch.int8 or int8_products):
            # One product buffer for every chunk: fresh pages for each (Q, C) block cost 23% of
            # a bf16 product here (1024 x 65536: 156 ms against 127 into a reused buffer) and
            # a third of an int8 one (225 ms against 149); kept between scans too
            # (``gpucache.scratch``)
            size = q * min(chunk, self._high)
            scratch = buffer(size, torch.int32 if int8_products else vectors.dtype)
        for start in range(0, self._high, chunk):
            stop = min(start + chunk, self._high)
            block = vectors[start:stop]  # (C, D)
            out = None if scratch is None else scratch[: q * (stop - start)]
            dead = (scopes[start:stop] != scope_id) | (expires[start:stop] <= now)  # (C,)
            any_dead = bool(dead.any())  # one pass over C, saving one over Q x C when all live
            if gemv_query is not None:
                # bf16 scores rank the candidates only; they are rescored in fp32 anyway
                scores = torch._weight_int8pack_mm(
                    gemv_query, block, scales[start:stop].to(torch.bfloat16)
                )  # (1, C)
            elif int8_queries is not None:
                # (Q, D) @ (D, C) -> (Q, C) int32, ranked by block_topk_scaled without the
                # query's own scale (the same along a row: these scores only choose candidates
                # for the fp32 rescore); the widening to float32 touches the chosen blocks only
                dots = torch._int_mm(
                    int8_queries, block.T, out=None if out is None else out.view(q, stop - start)
                )
                if any_dead:
                    dots.masked_fill_(dead, INT32_MASKED)
                top, idx = block_topk_scaled(
                    dots, scales[start:stop:INT8_SCALE_BLOCK], min(k, stop - start),
                    masked=any_dead,
                )  # (Q, k'), (Q, k')
                best_scores, best_rows, done = self._merge(
                    best_scores, best_rows, top, idx, start, stop, k)
                if done:
                    break
                continue
            elif vectors.dtype == torch.int8:
                scores = self._score(queries, block.float()) * scales[start:stop]  # (Q, C)
            elif vectors.dtype == torch.float32:
                scores = self._score(queries, block, out)  # (Q, C)
            else:
                # fp16/bf16 scores, ranked as they are: converting the whole block to fp32
                # first cost more than the topk (the candidates are rescored in fp32 anyway)
                scores = self._score(queries.to(block.dtype), block, out)  # (Q, C)
            if q > 1 and scores.T.is_contiguous():  # a rows-first product (``_score``)
                if any_dead:
                    scores.T.masked_fill_(dead[:, None], -math.inf)  # broadcast over queries
                top, idx = block_topk_rows(scores.T, min(k, stop - start))  # (Q, k'), (Q, k')
            else:
                if any_dead:
                    scores.masked_fill_(dead, -math.inf)  # broadcast over queries
                top, idx = block_topk(scores, min(k, stop - start))  # (Q, k'), (Q, k')
            best_scores, best_rows, done = self._merge(
                best_scores, best_rows, top, idx, start, stop, k)
            if done:
                break
        best_rows.masked_fill_(best_scores == -math.inf, -1)
        return best_scores, best_rows

    def _merge(
        self, best_scores: torch.Tensor, best_rows: torch.Tensor, top: torch.Tensor,
        idx: torch.Tensor, start: int, stop: int, k: int,
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The running top-k after chunk [start, stop) with its own top ``top`` at columns
        ``idx``; True when that chunk was the whole scan (its top-k is the answer, no merge to
        pay for)."""
        if start == 0 and stop == self._high and top.shape[1] == k:
            return top.float(), idx, True
        merged_scores = torch.cat([best_scores, top.float()], dim=1)  # (Q, K + k')
        merged_rows = torch.cat([best_rows, idx + start], dim=1)  # (Q, K + k')
        best_scores, pick = merged_scores.topk(k, dim=1)  # (Q, K)
        return best_scores, merged_rows.gather(1, pick), False  # (Q, K) each

    def _scan_numpy(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float, chunk: int,
        vectors: torch.Tensor, scopes: torch.Tensor, expires: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_scan`` for fp32 rows on a CPU whose fp32 products go through numpy's BLAS, on the
        same memory. The loop stays in numpy (see ``block_topk_numpy`` for why), except the
        top-k of a queries-first block (Q > ``ROWS_FIRST_MAX_QUERIES``), where torch's
        multi-core topk outweighs the handoff between the two thread pools."""
        high, q = self._high, queries.shape[0]
        # computed in numpy, not torch: torch's OpenMP threads keep spinning after a parallel
        # op and slowed the product that follows (100k rows, Q = 1: 14 ms against 8)
        dead = (scopes[:high].numpy() != scope_id) | (expires[:high].numpy() <= now)  # (N,)
        # One product buffer for every chunk, kept between scans too (``gpucache.scratch``): a
        # fresh (Q, C) array is fresh pages each time, whose faults cost 5% of a product (1024 x
        # 65536: 289 ms against 273)
        with self.scratch.lend(keep=not self._falling_back) as buffer:
            scratch = buffer(q * min(chunk, high), torch.float32)
            return self._scan_numpy_into(scratch, queries, k, chunk, vectors, dead)

    def _scan_numpy_into(
        self, scratch: torch.Tensor, queries: torch.Tensor, k: int, chunk: int,
        vectors: torch.Tensor, dead: np.ndarray,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        high, q = self._high, queries.shape[0]
        any_dead = bool(dead.any())
        best_scores = np.full((q, k), -np.inf, dtype=np.float32)
        best_rows = np.full((q, k), -1, dtype=np.int64)
        rows_first = q <= ROWS_FIRST_MAX_QUERIES  # the layout _score's product comes in
        for start in range(0, high, chunk):
            stop = min(start + chunk, high)
            product = self._score(queries, vectors[start:stop], scratch)  # (Q, C), no copies
            if rows_first:
                scores = product.numpy().T  # (C, Q), contiguous
                if any_dead:
                    scores[dead[start:stop]] = -np.inf  # dead rows, broadcast over queries
                top, idx = block_topk_numpy(scores, min(k, stop - start))  # (Q, k'), (Q, k')
            else:
                # A queries-first (Q, C) block: torch's topk uses every core where numpy's
                # reductions use one (1024 queries x 10k rows: 53 ms for the whole scan against
                # 61 ms here), and one call per block leaves the BLAS pool the cores between.
                if any_dead:
                    product.masked_fill_(torch.from_numpy(dead[start:stop]), -math.inf)
                top_t, idx_t = block_topk(product, min(k, stop - start))  # (Q, k'), (Q, k')
                top, idx = top_t.numpy(), idx_t.numpy()
            if start == 0 and stop == high and top.shape[1] == k:
                # the whole scan in one block (10k rows, 64 queries: 0.3 ms of a 5 ms scan)
                best_scores, best_rows = top, idx
                break
            merged_scores = np.concatenate([best_scores, top], axis=1)  # (Q, K + k')
            merged_rows = np.concatenate([best_rows, idx + start], axis=1)  # (Q, K + k')
            pick = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]  # (Q, K)
            best_scores = np.take_along_axis(merged_scores, pick, axis=1)
            best_rows = np.take_along_axis(merged_rows, pick, axis=1)
        best_rows[best_scores == -np.inf] = -1
        return torch.from_numpy(best_scores), torch.from_numpy(best_rows)

    def _score(
        self, queries: torch.Tensor, block: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(Q, C) dot products of the queries with a block of rows, on the fastest path.

        ``out``: a 1-D buffer of at least Q x C elements of the block's dtype to write the
        products into, reused across a scan's chunks (fresh pages cost 5-50% of a product on
        the CPU); the result is then a view of it, valid until the next chunk."""
        q, c = queries.shape[0], block.shape[0]
        target = None if out is None else out[: q * c]
        if block.device.type == "cpu":
            if FP32_MATMUL_VIA_NUMPY and block.dtype == torch.float32:
                if q <= ROWS_FIRST_MAX_QUERIES:  # (C, Q), seen as (Q, C)
                    into = None if target is None else target.numpy().reshape(c, q)
                    return torch.from_numpy(
                        np.matmul(block.numpy(), queries.numpy().T, out=into)
                    ).T
                into = None if target is None else target.numpy().reshape(q, c)
                return torch.from_numpy(np.matmul(queries.numpy(), block.numpy().T, out=into))
            if q == 1 and block.dtype != torch.float32:
                # a half-precision (1, D) x (D, C) product takes a slow path on the CPU (8 ms
                # for 10k bf16 rows here); the same numbers as (C, D) x (D, 1) took 0.5 ms
                return (block @ queries.T).T  # (C, 1) -> (1, C)
            low, high = BF16_ROWS_FIRST_QUERIES
            if (q <= ROWS_FIRST_MAX_QUERIES if block.dtype == torch.float32
                    else block.dtype == torch.bfloat16 and low <= q <= high):
                # (C, Q), seen as (Q, C); the scan takes its top-k rows-first
                # (``block_topk_rows``)
                rows_out = None if target is None else target.view(c, q)
                return torch.matmul(block, queries.T, out=rows_out).T
        if target is not None:
            return torch.matmul(queries, block.T, out=target.view(q, c))  # (Q, C)
        return queries @ block.T  # (Q, D) @ (D, C) -> (Q, C)

    def _take_rows(self, m: int) -> list[int]:
        reused = [self._free.pop() for _ in range(min(m, len(self._free)))]
        fresh = m - len(reused)
        if self._high + fresh > self._vectors.shape[0]:
            self._grow(self._high + fresh)
        rows = reused + list(range(self._high, self._high + fresh))
        self._high += fresh
        return rows

    def _grow(self, needed: int) -> None:
        if self.max_rows is not None and needed > self.max_rows:
            raise RuntimeError(
                f"gpucache bug: {needed} rows asked of a store capped at {self.max_rows} rows"
            )
        size = max(needed, 2 * self._vectors.shape[0])
        if self.max_rows is not None:
            size = min(size, self.max_rows)
        extra = size - self._vectors.shape[0]
        if self.quantization == "int8":
            self._scales = torch.cat([self._scales, self._scales.new_ones(extra)])
        if self.quantization != "fp32":
            self._full = torch.cat([self._full, self._full.new_zeros((extra, self.dim))])
        self._vectors = torch.cat(
            [self._vectors, self._vectors.new_zeros((extra, self.dim))], dim=0
        )
        self._scopes = torch.cat([self._scopes, self._scopes.new_full((extra,), FREE)])
        self._expires = torch.cat([self._expires, self._expires.new_full((extra,), NEVER)])
