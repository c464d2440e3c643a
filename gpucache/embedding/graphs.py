"""CUDA graphs of the lean encoder for small batches: one lookup, one graph launch.

Why: on CUDA the lean pass over one short prompt is some sixty kernel launches (about ten per
layer), each costing the CPU a few microseconds to issue, while the arithmetic of a batch-1
prompt takes less than that on the GPU. So a single lookup waits on launches, not on the GPU.
A CUDA graph records the launches of one input shape once and replays them as one.

Every prompt has its own token count, so inputs are padded up to a bucket, ``BATCH_BUCKETS`` x
``LENGTH_BUCKETS``: padded keys are masked out of the attention and padded positions out of the
pooling, so a bucket's embedding is the unpadded one's up to rounding. The embedder adopts the
graphs only where a load-time probe agrees with the eager pass (``TransformerEmbedder``). Larger
batches and longer prompts run eagerly: there the launches are a small part of the work.

A bucket's graph is captured the first time a batch of its shape arrives (a few warm-up passes,
then the capture), so the first lookup of each shape pays that once. The graphs share one
memory pool and one set of static input buffers per bucket; a lock keeps two threads from
replaying into the same buffers at once. Anything that fails during a capture turns the graphs
off for good, and the eager pass answers, so a capture problem costs speed, never an answer.

The capture itself is a parameter (``capture=``), so the bucketing, padding and slicing are
tested on the CPU through the real model with an eager stand-in (``eager_capture``); the CUDA
capture is tested on a GPU (``-m gpu``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

# Bucket sizes: a lookup is one prompt; a served proxy's coalesced batch holds a few. Prompts
# are rarely over 128 tokens at the sizes where launches dominate.
BATCH_BUCKETS = (1, 2, 4, 8)
LENGTH_BUCKETS = (16, 32, 64, 128)
WARMUP_PASSES = 3  # eager passes on a side stream before capture (cuBLAS and allocator warm-up)

Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (run, output): ``run()`` recomputes ``output`` in place from the static inputs
Captured = tuple[Callable[[], object], torch.Tensor]
Capture = Callable[[Callable[[], torch.Tensor], Any], Captured]


def bucket_for(batch: int, length: int) -> tuple[int, int] | None:
    """The smallest (batch, length) bucket that holds a ``batch`` x ``length`` input, or None
    when either is larger than every bucket (or not positive)."""
    if batch < 1 or length < 1:
        return None
    rows = next((b for b in BATCH_BUCKETS if batch <= b), None)
    cols = next((t for t in LENGTH_BUCKETS if length <= t), None)
    if rows is None or cols is None:
        return None
    return rows, cols


def cuda_capture(step: Callable[[], torch.Tensor], pool: Any) -> Captured:
    """Capture ``step`` as a CUDA graph in ``pool``: warm-up passes on a side stream first, as
    ``torch.cuda.graphs`` asks, then one capture; its output tensor is the graph's own."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_PASSES):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = step()
    return graph.replay, output


def eager_capture(step: Callable[[], torch.Tensor], pool: Any) -> Captured:
    """A stand-in for ``cuda_capture`` on any device: ``run()`` recomputes ``step`` into one
    output tensor, as a replay writes into the graph's output. For tests of the bucketing."""
    output = step()

    def run() -> None:
        output.copy_(step())

    return run, output


class _Bucket:
    """One captured shape: its static inputs, its replay and its output."""

    def __init__(
        self, rows: int, cols: int, device: torch.device, forward: Forward, capture: Capture, pool: Any
    ) -> None:
        self.ids = torch.zeros((rows, cols), dtype=torch.long, device=device)
        self.mask = torch.zeros((rows, cols), dtype=torch.long, device=device)
        self.mask[:, 0] = 1  # a padding row attends to one key, never to none (no NaN)
        self.run, self.output = capture(lambda: forward(self.ids, self.mask), pool)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        self.ids.zero_()
        self.mask.zero_()
        self.mask[:, 0] = 1
        self.ids[:b, :t].copy_(ids, non_blocking=True)
        self.mask[:b, :t].copy_(mask, non_blocking=True)
        self.run()
        return self.output[:b, :t].clone()  # the next replay overwrites the output


class GraphedEncoder:
    """The lean encoder replayed from graphs for inputs that fit a bucket.

    Args:
        forward: ``(ids, mask) -> (B, T, D)`` hidden states, always applying the mask (a graph
            cannot branch on whether a batch is padded): ``LeanEncoder`` with ``masked=True``.
        device: where the static inputs live.
        capture: how a bucket is recorded (``cuda_capture``; ``eager_capture`` in tests).
    """

    def __init__(self, forward: Forward, device: torch.device, capture: Capture = cuda_capture) -> None:
        self._forward = forward
        self._device = device
        self._capture = capture
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._lock = threading.Lock()
        self._pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.failure: str | None = None  # why the graphs were turned off, where they were

    def _reproduces(self, bucket: _Bucket, rows: int, cols: int) -> bool:
        """Whether a new bucket's replay gives the eager pass's output on an input unlike the
        one it was captured with (token ids that vary by position, a padded last row): a
        capture that recorded nothing, or replays stale buffers, is caught once, here, and
        the encoder stays eager rather than answering every later input with one output."""
        ids = (torch.arange(rows * cols, device=self._device).view(rows, cols) % 997) + 1000
        mask = torch.ones_like(ids)
        mask[-1, max(1, cols // 2) :] = 0
        replayed = bucket(ids, mask)
        eager = self._forward(ids, mask)
        return bool(torch.allclose(replayed.float(), eager.float(), rtol=1e-3, atol=1e-3))

    @property
    def captured(self) -> tuple[tuple[int, int], ...]:
        """The buckets recorded so far, as (batch, length)."""
        return tuple(sorted(self._buckets))

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """(B, T, D) hidden states of ``ids`` from a bucket's graph, or None where no bucket
        holds the input or the graphs are off (the caller then runs the eager pass)."""
        key = bucket_for(*ids.shape)
        if key is None or self.failure is not None:
            return None
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                try:
                    bucket = _Bucket(*key, self._device, self._forward, self._capture, self._pool)
                    if not self._reproduces(bucket, *key):
                        self.failure = f"a replay of bucket {key} did not reproduce the eager pass"
                        return None
                except Exception as error:  # noqa: BLE001 - any capture failure means eager
                    self.failure = f"{type(error).__name__}: {error}"
                    return None
                self._buckets[key] = bucket
            return bucket(ids, mask)
