"""Storage codecs: how an index keeps its rows on the device.

    mode    device bytes per row      host bytes per row (the fp32 copy, refine.py)
    fp32    4D + 16                   0
    fp16    2D + 16                   4D
    bf16    2D + 16                   4D
    int8    D + 20 (scale)            4D

(the 16 are the scope id and the expiry time, ``rows.py``; D = 384 for MiniLM: 1552, 784, 784,
404 bytes.)

int8 rows share one fp32 scale per block of ``INT8_SCALE_BLOCK`` consecutive rows (the top-k's
block): the block's largest live magnitude / 127. A shared scale lets the scan take block
maxima on int32 products and widen only the chosen blocks (``block_topk_scaled``); the cost is
precision for rows smaller than their block's largest, which the over-fetch and the fp32
rescore absorb (``bench/reports/performance-notes.md`` has the error and recall figures). A
scale is still stored per row, so the scan reads one per row as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpucache.index.interface import FREE
from gpucache.index.topk import BLOCK

INT8_SCALE_BLOCK = BLOCK
STORAGE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}


class Codec:
    """Rows stored in ``dtype`` as they are given (fp32, fp16, bf16)."""

    def __init__(self, mode: str, dim: int, rows: int, device: torch.device) -> None:
        self.mode, self.dim, self.dtype = mode, dim, STORAGE[mode]
        self.data = torch.zeros((rows, dim), dtype=self.dtype, device=device)  # (N_alloc, D)
        self.scales = torch.ones(0, device=device)  # per-row scales: int8 only

    @staticmethod
    def row_bytes(mode: str, dim: int) -> int:
        """Device bytes per row: the vector, its scale (int8), its scope id and its expiry."""
        return dim * torch.empty((), dtype=STORAGE[mode]).element_size() + 16 + (4 if mode == "int8" else 0)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales))

    def grow(self, extra: int) -> None:
        self.data = torch.cat([self.data, self.data.new_zeros((extra, self.dim))], dim=0)

    def write(
        self, rows: Sequence[int], vectors: torch.Tensor, full: torch.Tensor, scopes: torch.Tensor
    ) -> None:
        """Store ``vectors`` (M, D) fp32 at ``rows``. ``full`` (the host fp32 copy, already
        holding them) and ``scopes`` are for codecs that re-encode neighbours (int8)."""
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.data.device)
        self.data[index] = vectors.to(self.data.device, self.dtype)


class Int8BlockCodec(Codec):
    """int8 rows with one scale per block of ``INT8_SCALE_BLOCK`` rows."""

    def __init__(self, dim: int, rows: int, device: torch.device) -> None:
        super().__init__("int8", dim, rows, device)
        self.scales = torch.ones(rows, device=device)  # (N_alloc,) fp32, equal within a block

    def grow(self, extra: int) -> None:
        super().grow(extra)
        self.scales = torch.cat([self.scales, self.scales.new_ones(extra)])

    def write(
        self, rows: Sequence[int], vectors: torch.Tensor, full: torch.Tensor, scopes: torch.Tensor
    ) -> None:
        """Quantize the blocks that hold ``rows`` from the fp32 copy, each with one scale: its
        live rows' largest magnitude / 127. A new row larger than its block's scale
        re-quantizes the block's other rows with it; a block whose largest row left gets a
        finer scale the next time a row joins it."""
        size, capacity, device = INT8_SCALE_BLOCK, self.data.shape[0], self.data.device
        blocks = torch.tensor(sorted({r // size for r in rows}), dtype=torch.int64)  # (B,)
        members = blocks[:, None] * size + torch.arange(size)  # (B, S) row numbers
        exists = members < capacity  # the last block may be cut short by the capacity
        members = members.clamp(max=capacity - 1)
        block_rows = full[members]  # (B, S, D)
        live = (scopes[members.to(device)].cpu() != FREE) & exists  # (B, S)
        magnitude = block_rows.abs().amax(dim=2).masked_fill_(~live, 0.0)  # (B, S)
        scales = magnitude.amax(dim=1).clamp(min=1e-12) / 127.0  # (B,)
        quantized = (block_rows / scales[:, None, None]).round().clamp(-127, 127).to(torch.int8)
        targets = members[exists].to(device)
        self.data[targets] = quantized[exists].to(device)
        self.scales[targets] = scales[:, None].expand(-1, size)[exists].to(device)


def make_codec(mode: str, dim: int, rows: int, device: torch.device) -> Codec:
    if mode == "int8":
        return Int8BlockCodec(dim, rows, device)
    return Codec(mode, dim, rows, device)
