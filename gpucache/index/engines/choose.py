"""Which engine an index scans with: chosen once per device and storage dtype, and per shape
between torch and Triton where both can run on CUDA (``ScanKernelChooser``)."""

from __future__ import annotations

import torch

from gpucache.index.engines.base import RowsView, ScanEngine, ScanJob
from gpucache.index.engines.int8_cpu import Int8CpuEngine
from gpucache.index.engines.numpy_engine import NumpyEngine
from gpucache.index.engines.torch_engine import TorchEngine
from gpucache.index.engines.triton_engine import TritonEngine, device_capability, kernel_takes
from gpucache.index.kernel_choice import ScanKernelChooser
from gpucache.index.probes import CpuPaths
from gpucache.index.scratch import BufferSource, host_buffer


def default_engine(device: torch.device, dtype: torch.dtype, paths: CpuPaths | None = None) -> ScanEngine:
    """The engine for rows of ``dtype`` on ``device``, from what this CPU can do."""
    if device.type == "cpu":
        paths = paths if paths is not None else CpuPaths.detect()
        if dtype == torch.float32 and paths.fp32_via_numpy:
            return NumpyEngine()
        if dtype == torch.int8 and (paths.int8_matmul or paths.int8_gemv):
            return Int8CpuEngine(matmul=paths.int8_matmul, gemv=paths.int8_gemv)
    return TorchEngine()


class ChoosingEngine:
    """Scans with whichever of its engines ``chooser`` measured faster for the scan's shape."""

    name = "auto"

    def __init__(self, chooser: ScanKernelChooser, engines: dict[str, ScanEngine]) -> None:
        self.chooser = chooser
        self.engines = engines

    def scan(self, rows: RowsView, job: ScanJob, buffer: BufferSource) -> tuple[torch.Tensor, torch.Tensor]:
        # A measurement may run after this scan has returned its buffer and while the store
        # changes: it scans this view (its tensors stay alive; rows written meanwhile only
        # change the scores it throws away) into buffers of its own.
        name = self.chooser.choose(
            job.queries.shape[0], rows.high, lambda name: self.engines[name].scan(rows, job, host_buffer)
        )
        return self.engines[name].scan(rows, job, buffer)


def engine_for(
    scan_kernel: str, device: torch.device, dtype: torch.dtype
) -> tuple[ScanEngine, ScanKernelChooser | None]:
    """The engine for an index's ``scan_kernel`` setting, and its chooser under "auto" where
    there is a choice to make (CUDA, Triton installed, a dtype the kernel takes)."""
    if scan_kernel == "triton":
        return TritonEngine(), None
    if (
        scan_kernel == "auto"
        and device.type == "cuda"
        and kernel_takes(dtype, device_capability(device))
        and _triton_importable()
    ):
        chooser = ScanKernelChooser(device)
        return ChoosingEngine(chooser, {"torch": TorchEngine(), "triton": TritonEngine()}), chooser
    return default_engine(device, dtype), None


def _triton_importable() -> bool:
    from gpucache.kernels import triton_available

    return triton_available()
