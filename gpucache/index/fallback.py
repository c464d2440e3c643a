"""Out of device memory during a scan: retry smaller, then scan on the CPU.

The cache shares the GPU with a model, whose memory use moves. A scan that runs out of device
memory is retried with half the chunk (half the scratch), down to ``MIN_SCAN_ROWS``; past that
it runs on the CPU, with a ``RuntimeWarning``, rather than fail the lookup. Both are counted
(``scan_retries``, ``cpu_fallbacks``; the cache reports them in ``stats()``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import torch

R = TypeVar("R")
MIN_SCAN_ROWS = 256  # below this a smaller chunk saves too little memory to be worth a retry


class OomFallback:
    def __init__(self) -> None:
        self.scan_retries = 0
        self.cpu_fallbacks = 0

    def run(self, on_device: Callable[[int], R], on_cpu: Callable[[int], R], chunk: int) -> R:
        """``on_device(chunk)``, retried with smaller chunks on OOM, else ``on_cpu(chunk)``."""
        while True:
            try:
                return on_device(chunk)
            except torch.OutOfMemoryError:
                if chunk <= MIN_SCAN_ROWS:
                    break
                chunk //= 2
                self.scan_retries += 1
        warnings.warn(
            "gpucache: the device ran out of memory during the similarity scan; this scan ran on the CPU",
            RuntimeWarning,
            stacklevel=4,
        )
        self.cpu_fallbacks += 1
        return on_cpu(chunk)
