"""What the benchmark runs on the machine it is given (gpucache/benchmark/sizing.py): sizes
chosen against a pretend memory budget, slow cells left out by their projected time, each with
its reason."""

from __future__ import annotations

from gpucache.benchmark.sizing import CellPlan, MemoryPlan, TimePlan, scan_cell_bytes, store_bytes
from gpucache.index.codecs import Codec

GIB = 2**30
MODES = ["fp32", "fp16", "bf16", "int8"]


def test_a_cell_counts_the_set_the_store_its_host_copy_and_faiss():
    n, dim = 1_000_000, 384
    assert store_bytes("fp32", n, dim) == (Codec.row_bytes("fp32", dim) * n, 0)
    assert store_bytes("int8", n, dim) == (Codec.row_bytes("int8", dim) * n, 4 * dim * n)
    host, device = scan_cell_bytes("fp16", n, 1024, dim, on_gpu=False, faiss=True)
    assert device == 0
    # the set (4D), the store (2D + 16) and its fp32 copy (4D), FAISS fp16 (2D) and flat (4D)
    counted = n * (4 * dim + Codec.row_bytes("fp16", dim) + 4 * dim + 2 * dim + 4 * dim)
    assert counted < host < counted + GIB  # plus bounded work space
    without_faiss, _ = scan_cell_bytes("fp16", n, 1024, dim, on_gpu=False, faiss=False)
    assert host - without_faiss == n * 6 * dim
    # on a GPU the store's rows and the read's copy are device memory, the rest host memory
    host_gpu, device_gpu = scan_cell_bytes("fp16", n, 1024, dim, on_gpu=True, faiss=True)
    assert device_gpu > Codec.row_bytes("fp16", dim) * n + 4 * dim * n
    assert host_gpu < host


def test_sizes_fit_a_pretend_memory_budget_and_the_rest_are_named():
    # a 24 GiB machine with 22 GiB available: 10M rows need ~60 GiB, 1M ~6 GiB
    plan = MemoryPlan(host_available=22 * GIB, device_available=22 * GIB, on_gpu=False, faiss=True)
    assert plan.sizes((10_000, 100_000, 1_000_000, 10_000_000), MODES, 1024) == [10_000, 100_000, 1_000_000]
    (skipped,) = plan.skipped
    assert skipped.what == "scan, N = 10,000,000"
    assert "of host memory, past 50% of the 22.0 GiB available when the scans began (11.0 GiB)" in skipped.why
    # a 4 GiB machine: 1M no longer fits
    small = MemoryPlan(host_available=4 * GIB, device_available=4 * GIB, on_gpu=False, faiss=True)
    assert small.sizes((10_000, 100_000, 1_000_000), MODES, 1024) == [10_000, 100_000]
    assert [s.what for s in small.skipped] == ["scan, N = 1,000,000"]
    # a GPU with little memory and a large host: the device is what runs out, and says so
    gpu = MemoryPlan(host_available=128 * GIB, device_available=2 * GIB, on_gpu=True, faiss=True)
    assert gpu.sizes((100_000, 1_000_000), MODES, 1024) == [100_000]
    assert "of device memory" in gpu.skipped[0].why
    # the fraction is the operator's
    tenth = MemoryPlan(
        host_available=4 * GIB, device_available=4 * GIB, on_gpu=False, faiss=True, fraction=0.1
    )
    assert tenth.sizes((10_000, 100_000), MODES, 1024) == [10_000]
    assert "past 10% of the 4.0 GiB available when the scans began (0.4 GiB)" in tenth.skipped[0].why


def test_the_largest_cell_decides_a_size():
    """fp16 holds the most (its copy, FAISS's fp16 and flat indexes): a budget that fits fp32's
    cell but not fp16's leaves the size out."""
    n = 1_000_000
    fp32, _ = scan_cell_bytes("fp32", n, 1024, 384, on_gpu=False, faiss=True)
    fp16, _ = scan_cell_bytes("fp16", n, 1024, 384, on_gpu=False, faiss=True)
    assert fp32 < fp16
    budget = (fp32 + fp16) // 2
    plan = MemoryPlan(host_available=budget, device_available=budget, on_gpu=False, faiss=True, fraction=1.0)
    assert plan.sizes((n,), ["fp32"], 1024) == [n]
    assert plan.sizes((n,), ["fp32", "fp16"], 1024) == []


def test_an_engine_is_projected_from_its_cost_one_size_smaller():
    plan = TimePlan(deadline=1000.0, cell_seconds=60.0, repeat=3)
    assert plan.per_call("faiss", "fp16", 100_000, 1024) is None  # nothing smaller: it runs
    assert plan.admit([("faiss", "fp16")], 100_000, 1024, now=0.0) == CellPlan([True], 3)
    plan.record("faiss", "fp16", 100_000, 1024, 2.0)
    plan.record("gpucache", "fp16", 100_000, 1024, 0.1)
    assert plan.per_call("faiss", "fp16", 1_000_000, 1024) == (
        20.0,
        "20.00 s a call, from 2.000 s at N = 100,000",
    )
    # a slow call: the cell is timed once after a warm-up (2 calls); FAISS's 40 s fits 60 s
    assert plan.admit([("gpucache", "fp16"), ("faiss", "fp16")], 1_000_000, 1024, now=0.0) == CellPlan(
        [True, True], 1
    )
    # at 10M: FAISS's 2 x 200 s passes the 60 s a cell; gpucache's 2 x 10 s runs
    assert plan.admit([("gpucache", "fp16"), ("faiss", "fp16")], 10_000_000, 1024, now=0.0) == CellPlan(
        [True, False], 1
    )
    (skipped,) = plan.skipped
    assert skipped.what == "scan faiss fp16, N = 10,000,000, Q = 1024"
    assert skipped.why.startswith("projected 400 s (200.00 s a call") and "past 60 s a cell" in skipped.why
    # another Q is projected from its own Q only; quick calls keep every repeat
    assert plan.per_call("faiss", "fp16", 1_000_000, 64) is None
    plan.record("gpucache", "fp16", 100_000, 64, 0.01)
    assert plan.admit([("gpucache", "fp16")], 1_000_000, 64, now=0.0) == CellPlan([True], 3)


def test_timed_together_makes_the_calls_the_plan_counts():
    import torch

    from gpucache.benchmark import timing

    made: list[int] = []
    for repeat in (1, 2, 3, 5):
        made.clear()
        clock = iter(range(0, 10**6, 10)).__next__  # every call takes 10 s: no extra runs
        timing.timed_together([lambda: made.append(1)], torch.device("cpu"), repeat, clock=clock)
        assert len(made) == TimePlan.calls(repeat)


def test_engines_are_admitted_while_the_time_left_holds_them():
    plan = TimePlan(deadline=100.0, cell_seconds=60.0, repeat=1)
    for engine in ("a", "b", "c"):
        plan.record(engine, "fp32", 10, 1, 1.0)
    # each projects 2 calls x 10 s = 20 s; 50 s left takes two of them
    assert plan.admit([("a", "fp32"), ("b", "fp32"), ("c", "fp32")], 100, 1, now=50.0).admitted == [
        True,
        True,
        False,
    ]
    assert "past the 10 s left" in plan.skipped[0].why
    # past the deadline, nothing projected runs
    assert plan.admit([("a", "fp32")], 100, 1, now=120.0).admitted == [False]
    assert "past the 0 s left" in plan.skipped[1].why
