"""The device a cache runs on (gpucache/devices.py): resolved once, CUDA asked for where there is
none a clear error, and the CPU's facts read from the machine."""

from __future__ import annotations

import pytest
import torch

from gpucache import devices


def test_auto_is_cuda_where_present_and_the_cpu_elsewhere():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert devices.resolve_device("auto").type == expected
    assert devices.resolve_device("cpu") == devices.resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_cuda_asked_for_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA device is available"):
        devices.resolve_device("cuda:1")


@pytest.mark.parametrize("device, error", [("tpu", ValueError), ("meta", ValueError), (3, TypeError)])
def test_a_device_the_cache_cannot_use_is_refused(device, error):
    with pytest.raises(error):
        devices.resolve_device(device)


def test_the_cpu_facts_follow_its_flags(monkeypatch):
    flags = "fpu avx2 avx512f avx512_vnni avx512_bf16"
    monkeypatch.setattr(devices, "_cpuinfo", lambda field: flags if field == "flags" else "AuthenticAMD")
    assert devices.cpu_features() == ["AVX2", "AVX-512", "VNNI", "AVX-512 BF16"]
    assert devices.cpu_has_native_bf16() and devices.cpu_vendor() == "AuthenticAMD"
    monkeypatch.setattr(devices, "_cpuinfo", lambda field: "fpu sse2" if field == "flags" else "")
    assert devices.cpu_features() == [] and not devices.cpu_has_native_bf16()
