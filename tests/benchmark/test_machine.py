"""What the benchmark reads of the machine (gpucache/benchmark/machine.py): memory there is and
memory held, the commit, and matmul rates measured at a size the machine can do quickly."""

from __future__ import annotations

import torch

from gpucache.benchmark import machine


def test_memory_available_is_within_the_total_and_the_peak_grows_with_what_is_held():
    cpu = torch.device("cpu")
    total, available = machine.total_bytes(cpu), machine.available_bytes(cpu)
    assert 0 < available <= total
    before = machine.peak_bytes(cpu)
    held = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    held += 1
    assert machine.peak_bytes(cpu) >= before and machine.peak_bytes(cpu) > 64 * 2**20
    del held


def test_the_commit_is_read_from_the_checkout():
    import subprocess

    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=machine.PACKAGE_ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert machine.commit().split("+")[0] == head


def test_a_dtype_the_machine_only_emulates_is_measured_small(monkeypatch):
    sizes = []

    def seconds(device, dtype, repeat, size):
        sizes.append(size)
        return 1e-3 * (size / 512) ** 3 * (100 if dtype == torch.bfloat16 else 1)

    monkeypatch.setattr(machine, "_matmul_seconds", seconds)
    cpu = torch.device("cpu")
    machine.matmul_rate(cpu, torch.float32, 3, 2048)  # 64 ms at 2048: measured there
    assert sizes == [512, 2048]
    sizes.clear()
    rate = machine.matmul_rate(cpu, torch.bfloat16, 3, 2048)  # 6.4 s at 2048: measured at 512
    assert sizes == [512, 512]
    assert rate == 2 * 512**3 / 0.1 / 1e12


def test_int8_compute_is_measured_where_the_store_multiplies_in_int8():
    from gpucache.index.probes import CpuPaths

    assert machine.matmul_rate(torch.device("cpu"), torch.int8, 1, 64) > 0
    _, rates = machine.machine_limits(torch.device("cpu"), 1, quick=True)
    assert ("int8" in rates) == CpuPaths.detect().int8_matmul and {"fp32", "bf16", "fp16"} <= set(rates)
