"""GPU telemetry from NVML, for ``gpucache info`` and the benchmarks.

NVML (``pynvml``, from the nvidia-ml-py package) talks to the driver directly, so it sees memory
used by every process on the GPU, the model beside the cache included, which torch's allocator
cannot. Without a driver (a CPU machine, CI) every function returns None or an empty list: the
absence of a GPU is a fact to report, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_percent: int | None
    power_watts: float | None


def gpu_readings() -> list[GpuReading]:
    """One reading per GPU NVML can see; [] when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded on CPU machines
        return []
    try:
        readings = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            readings.append(
                GpuReading(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    memory_total_bytes=int(memory.total),
                    memory_used_bytes=int(memory.used),
                    utilization_percent=_optional(
                        lambda h=handle: int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
                    ),
                    power_watts=_optional(lambda h=handle: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                )
            )
        return readings
    finally:
        pynvml.nvmlShutdown()


def _optional(read):  # type: ignore[no-untyped-def]
    """Some GPUs (and MIG slices) do not report every field; a missing field is None."""
    try:
        return read()
    except Exception:
        return None
