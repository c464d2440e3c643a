"""Where tensors live. The device is resolved here, once, and passed on as a ``torch.device``.

``"auto"`` picks CUDA when a GPU is visible and the CPU otherwise, so the same code runs on a
laptop, in CI and on an inference server; every other module takes the resolved device.
"""

from __future__ import annotations

import functools

import torch

DeviceLike = str | torch.device


def resolve_device(device: DeviceLike = "auto") -> torch.device:
    """Turn ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` into a device.

    Asking for CUDA where none is available is the caller's mistake and raises ``ValueError``
    rather than failing later inside the first matmul.
    """
    if isinstance(device, torch.device):
        resolved = device
    elif isinstance(device, str):
        if device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            resolved = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from exc
    else:
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but no CUDA device is available")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    return resolved


@functools.cache
def _cpuinfo(field: str) -> str:
    """The first value of ``field`` in Linux's ``/proc/cpuinfo``; "" elsewhere, which reads as
    "no special fast paths"."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_vendor() -> str:
    """The CPU's vendor id (such as AuthenticAMD or GenuineIntel); empty where unknown."""
    return _cpuinfo("vendor_id")


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (empty where unknown)."""
    return frozenset(_cpuinfo("flags").split())


def cpu_has_native_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX), where a bf16 model
    runs faster than fp32; elsewhere bf16 is emulated and slower."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


# The instruction sets that decide the CPU paths (bf16 matmuls, oneDNN packing, int8 products),
# as /proc/cpuinfo names them, with the names a reader knows them by.
CPU_FEATURES = (
    ("AVX2", ("avx2",)),
    ("AVX-512", ("avx512f",)),
    ("VNNI", ("avx512_vnni", "avx_vnni")),
    ("AVX-512 BF16", ("avx512_bf16",)),
    ("AMX", ("amx_tile",)),
)


def cpu_features() -> list[str]:
    """Which of ``CPU_FEATURES`` this CPU has, in that order (empty where unknown)."""
    flags = cpu_flags()
    return [name for name, names in CPU_FEATURES if flags & set(names)]
