"""scan_kernel="auto": the store times both scan kernels on its own data and keeps the faster,
per query bucket and size class. The choice moves speed only, never an answer."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from gpucache.index.engines.choose import ChoosingEngine
from gpucache.index.engines.torch_engine import TorchEngine
from gpucache.index.engines.triton_engine import TritonEngine
from gpucache.index.kernel_choice import (
    STRAYS_IN_A_ROW,
    TIMED_RUNS,
    ScanKernelChooser,
    bucket,
    size_class,
    wall_timer,
)
from gpucache.index.store import ExactScanStore
from gpucache.kernels import triton_available


class ScriptedTimer:
    """Runs the scan it is given (so the measured code really runs) and reports the seconds
    scripted for that kernel, as a real timer would report what it saw."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self.measured: list[str] = []
        self.results: dict[str, object] = {}

    def __call__(self, run, device):
        kernel = run.args[0]  # functools.partial(run, kernel)
        self.measured.append(kernel)
        self.results[kernel] = run()
        return self.seconds[kernel]


def INLINE(measure):
    """Measure in the lookup itself, so a test sees the choice at once."""
    measure()


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


@pytest.mark.parametrize(("queries", "want"), [(1, "1"), (2, "<=64"), (64, "<=64"), (65, ">64")])
def test_query_buckets(queries, want):
    assert bucket(queries) == want


def test_size_classes_are_powers_of_four():
    assert [size_class(n) for n in (1, 3, 4, 15, 16, 65536, 262143, 262144)] == [0, 0, 1, 1, 2, 8, 8, 9]
    assert [size_class(4**k) for k in range(1, 30)] == list(range(1, 30))
    assert [size_class(4**k - 1) for k in range(1, 30)] == list(range(0, 29))


def test_the_faster_kernel_is_kept_per_shape_and_measured_once():
    timer = ScriptedTimer({"torch": 2.0, "triton": 1.0})
    chooser = ScanKernelChooser(torch.device("cpu"), min_rows=100, timer=timer, start=INLINE)
    ran: list[str] = []
    assert chooser.choose(64, 1000, ran.append) == "triton"
    assert timer.measured == ["torch", "triton"] and ran == ["torch", "triton"]
    assert chooser.choose(32, 1000, ran.append) == "triton"  # same bucket, same size class
    assert chooser.choose(64, 4000, ran.append) == "triton"  # 4x the rows: measured again
    assert len(timer.measured) == 4
    timer.seconds = {"torch": 0.5, "triton": 1.0}
    assert chooser.choose(1, 1000, ran.append) == "torch"  # Q = 1 is its own shape
    assert chooser.choices == {("<=64", 4): "triton", ("<=64", 5): "triton", ("1", 4): "torch"}
    assert chooser.timings[("1", 4)] == {"torch": 0.5, "triton": 1.0}


def test_a_small_store_uses_torch_unmeasured_and_a_tie_keeps_torch():
    timer = ScriptedTimer({"torch": 1.0, "triton": 1.0})
    chooser = ScanKernelChooser(torch.device("cpu"), min_rows=100, timer=timer, start=INLINE)
    assert chooser.choose(64, 99, lambda name: None) == "torch" and timer.measured == []
    assert chooser.choose(64, 100, lambda name: None) == "torch" and len(timer.measured) == 2


def test_wall_timer_warms_up_then_takes_the_median():
    """Each run advances a scripted clock by its own duration: the warm-up's (the slowest) is
    left out, and the median of the timed runs is neither their mean nor their minimum."""
    durations = [9.0, 3.0, 1.0, 2.0, 100.0, 4.0, 7.0, 5.0][: TIMED_RUNS + 1]
    now, calls = [0.0], []

    def run():
        now[0] += durations[len(calls)]
        calls.append(1)

    seconds = wall_timer(run, torch.device("cpu"), clock=lambda: now[0])
    assert len(calls) == TIMED_RUNS + 1
    assert seconds == sorted(durations[1:])[len(durations[1:]) // 2]


def test_auto_is_torch_where_there_is_nothing_to_choose():
    assert ExactScanStore(8, device="cpu").scan_kernel == "torch"  # the default is "auto"
    assert ExactScanStore(8, device="cpu").kernel_chooser is None
    assert ExactScanStore(8, device="cpu", quantization="int8").scan_kernel == "torch"
    with pytest.raises(ValueError, match="'auto', 'torch' or 'triton'"):
        ExactScanStore(8, scan_kernel="fastest")


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("faster", ["torch", "triton"])
def test_an_auto_store_answers_the_same_whichever_kernel_wins(faster):
    """Both kernels really run (Triton under its CPU interpreter here); the store answers with
    the winner and the answers agree with a torch-only store."""
    n, d, q, k = 300, 16, 3, 4
    vectors, queries = unit_rows(n, d, 1), unit_rows(q, d, 2)
    expires = [math.inf if i % 7 else 5.0 for i in range(n)]
    reference = ExactScanStore(d, device="cpu", scan_kernel="torch")
    timer = ScriptedTimer({"torch": 1.0, "triton": 1.0, faster: 0.5})
    chooser = ScanKernelChooser(torch.device("cpu"), min_rows=1, timer=timer, start=INLINE)
    # the engine a CUDA store with Triton is built with, here on the CPU
    auto = ExactScanStore(
        d, device="cpu", engine=ChoosingEngine(chooser, {"torch": TorchEngine(), "triton": TritonEngine()})
    )
    for store in (reference, auto):
        store.add(vectors, 0, expires)
    want = reference.search(queries, k, 0, now=10.0)
    got = auto.search(queries, k, 0, now=10.0)
    assert chooser.choices == {("<=64", size_class(n)): faster}
    for result in (got, *timer.results.values()):
        torch.testing.assert_close(result[0], want[0], rtol=0, atol=1e-5)
        assert torch.equal(result[1], want[1])


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()), reason="needs CUDA and triton")
def test_on_cuda_auto_measures_and_agrees_with_torch():
    n, d, q, k = 70_000, 384, 64, 4
    vectors, queries = unit_rows(n, d, 3).cuda(), unit_rows(q, d, 4).cuda()
    auto = ExactScanStore(d, device="cuda", initial_rows=n)
    plain = ExactScanStore(d, device="cuda", initial_rows=n, scan_kernel="torch")
    for store in (auto, plain):
        store.add(vectors, 0, [math.inf] * n)
    assert auto.scan_kernel == "auto" and auto.kernel_chooser is not None
    got, want = auto.search(queries, k, 0), plain.search(queries, k, 0)
    assert auto.kernel_chooser.wait_measured(timeout=120)
    ((shape, choice),) = auto.kernel_chooser.choices.items()  # one shape, measured once
    timings = auto.kernel_chooser.timings[shape]
    assert set(timings) == {"torch", "triton"}  # both kernels really ran and were timed
    assert choice == min(timings, key=timings.__getitem__)  # and the faster one was kept
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-4)


class GatedTimer(ScriptedTimer):
    """A scripted timer that holds every measurement until the test opens its gate."""

    def __init__(self, seconds):
        super().__init__(seconds)
        self.gate = threading.Event()
        self.started = threading.Event()

    def __call__(self, run, device):
        self.started.set()
        assert self.gate.wait(timeout=60)
        return super().__call__(run, device)


def test_a_new_shape_is_measured_in_a_thread_while_lookups_scan_with_torch():
    """The lookup that meets a new shape does not wait for the measurement (which compiles
    and times eight scans on a GPU): it and every lookup until the measurement ends get torch,
    and one measurement runs per shape however many lookups meet it."""
    timer = GatedTimer({"torch": 2.0, "triton": 1.0})
    chooser = ScanKernelChooser(torch.device("cpu"), min_rows=100, timer=timer)
    assert chooser.choose(64, 1000, lambda kernel: kernel) == "torch"  # returned, gate shut
    assert timer.started.wait(timeout=60)
    assert chooser.choose(64, 1000, lambda kernel: kernel) == "torch"
    assert chooser.wait_measured(timeout=0) is False
    timer.gate.set()
    assert chooser.wait_measured(timeout=60)
    assert timer.measured == ["torch", "triton"]  # one measurement, both kernels
    assert chooser.choose(64, 1000, lambda kernel: kernel) == "triton"


def test_a_failed_measurement_settles_the_shape_on_torch_once():
    calls = []

    def failing_timer(run, device):
        calls.append(run.args[0])
        raise torch.cuda.OutOfMemoryError("CUDA out of memory while timing")

    chooser = ScanKernelChooser(torch.device("cpu"), min_rows=1, timer=failing_timer, start=INLINE)
    assert chooser.choose(64, 1000, lambda kernel: None) == "torch"
    assert chooser.choose(64, 1000, lambda kernel: None) == "torch"
    assert calls == ["torch"]  # not measured again on the next lookup
    [(shape, error)] = chooser.errors.items()
    assert error.startswith("OutOfMemoryError") and chooser.timings == {}


def test_an_auto_store_answers_while_its_kernels_are_measured_in_the_background():
    """Through a store: the first search answers (with torch) while the measurement, in its
    own thread, scans the same rows into its own buffers; afterwards the winner answers and the
    answers agree."""
    n, d, q, k = 300, 16, 3, 4
    vectors, queries = unit_rows(n, d, 5), unit_rows(q, d, 6)
    timer = GatedTimer({"torch": 2.0, "triton": 1.0})
    chooser = ScanKernelChooser(torch.device("cpu"), min_rows=1, timer=timer)
    # "triton" here is a second torch engine: the thread and the choice are what is tested
    auto = ExactScanStore(
        d, device="cpu", engine=ChoosingEngine(chooser, {"torch": TorchEngine(), "triton": TorchEngine()})
    )
    auto.add(vectors, 0, [math.inf] * n)
    first = auto.search(queries, k, 0)
    assert chooser.choices == {}  # the measurement is still held at the gate
    timer.gate.set()
    assert chooser.wait_measured(timeout=60)
    assert chooser.choices == {("<=64", size_class(n)): "triton"}
    second = auto.search(queries, k, 0)
    assert torch.equal(first[1], second[1])
    for result in timer.results.values():
        assert torch.equal(result[1], first[1])


@pytest.mark.parametrize(
    ("dtype", "capability", "takes"),
    [
        (torch.float32, (7, 5), True),
        (torch.float16, (7, 0), True),
        (torch.bfloat16, (7, 5), False),
        (torch.bfloat16, (8, 0), True),
        (torch.bfloat16, (9, 0), True),
        (torch.bfloat16, None, True),
        (torch.int8, (9, 0), False),
        (torch.int8, None, False),
    ],
)
def test_the_kernel_takes_bf16_only_from_compute_capability_8(dtype, capability, takes):
    from gpucache.index.engines.triton_engine import kernel_takes

    assert kernel_takes(dtype, capability) is takes


def test_rows_the_kernel_cannot_take_are_scanned_by_torch(monkeypatch):
    """A bf16 store on a pre-Ampere GPU: the Triton engine hands the scan to torch instead of
    failing in Triton's code generation (the capability is scripted; the scan runs on the CPU)."""
    from gpucache.index.engines import triton_engine
    from gpucache.index.engines.base import RowsView, ScanJob
    from gpucache.index.scratch import host_buffer

    monkeypatch.setattr(triton_engine, "device_capability", lambda device: (7, 5))
    n, d = 50, 16
    vectors = unit_rows(n, d, 7).to(torch.bfloat16)
    rows = RowsView(
        vectors,
        torch.empty(0),
        torch.zeros(n, dtype=torch.int64),
        torch.full((n,), math.inf, dtype=torch.float64),
        n,
    )
    job = ScanJob(unit_rows(2, d, 8), 3, 0, 0.0, 64)
    scanned = []
    monkeypatch.setattr(
        TorchEngine, "scan", lambda self, r, j, b: scanned.append(r.vectors.dtype) or ("torch", None)
    )
    assert TritonEngine().scan(rows, job, host_buffer) == ("torch", None)
    assert scanned == [torch.bfloat16]


# ------------------------------------------- a quantized CPU store: its rows or its exact copy


class CountingEngine:
    """The store's own engine, counting the scans of the quantized rows."""

    def __init__(self, engine) -> None:
        self.engine, self.name, self.scans = engine, engine.name, 0

    def scan(self, rows, job, buffer):
        self.scans += 1
        return self.engine.scan(rows, job, buffer)


def measured_int8_store(n: int, seconds: dict[str, float]):
    from gpucache.index.kernel_choice import STORE_PATHS
    from gpucache.index.paths import PATH_CHOICE_MIN_ROWS, unmeasured_path

    store = ExactScanStore(32, device="cpu", quantization="int8")
    assert store.path_chooser is not None and store.path_chooser.min_rows == PATH_CHOICE_MIN_ROWS
    timer = ScriptedTimer(seconds)
    store.path_chooser = ScanKernelChooser(
        store.device, min_rows=64, timer=timer, start=INLINE, options=STORE_PATHS, unmeasured=unmeasured_path
    )
    store.add(unit_rows(n, 32, seed=5), 0, [math.inf] * n)
    store.engine = CountingEngine(store.engine)
    return store, timer


@pytest.mark.parametrize("faster", ["quantized", "copy"])
def test_a_quantized_cpu_store_answers_batches_the_way_measured_faster(faster):
    """Where int8 products are slow (an AVX2 CPU without VNNI), batches scan the exact copy;
    where they are fast, the int8 rows. Both ways return the exact scores of the same rows."""
    slower = {"quantized": "copy", "copy": "quantized"}[faster]
    store, timer = measured_int8_store(3000, {faster: 1.0, slower: 2.0})
    queries = unit_rows(40, 32, seed=6)
    scores, rows = store.search(queries, 3, 0)
    assert timer.measured == ["quantized", "copy"]
    assert store.scan_paths == {"<=64 queries, 4^5 rows": faster}
    scans_before = store.engine.scans
    again_scores, again_rows = store.search(queries, 3, 0)
    assert (store.engine.scans > scans_before) is (faster == "quantized")
    # the measured runs and the lookups agree: the path moves speed, never an answer (the
    # measured runs scanned the bucket's largest batch: these 40 queries, repeated to 64)
    for got_scores, got_rows in (
        timer.results["quantized"],
        timer.results["copy"],
        (again_scores, again_rows),
    ):
        torch.testing.assert_close(got_scores[:40], scores, rtol=0, atol=1e-6)
        assert torch.equal(got_rows[:40], rows)


def test_an_unmeasured_quantized_cpu_store_scans_int8_for_one_query_and_the_copy_for_batches():
    """Below the measured sizes (and while a measurement runs): one query takes the int8
    rows, the reason 'auto' stores int8; a batch takes the fp32 copy, never far from the best
    on any CPU, where int8 batches were reported far slower than fp32 on one."""
    store, timer = measured_int8_store(50, {"quantized": 1.0, "copy": 1.0})
    store.search(unit_rows(1, 32, seed=7), 2, 0)
    assert store.engine.scans == 1
    store.search(unit_rows(8, 32, seed=8), 2, 0)
    assert store.engine.scans == 1 and timer.measured == [] and store.scan_paths == {}


def test_a_pinned_refine_policy_or_engine_is_never_second_guessed():
    from gpucache.index.refine import RefinePolicy

    assert ExactScanStore(32, device="cpu", quantization="int8", refine=RefinePolicy()).path_chooser is None
    assert ExactScanStore(32, device="cpu", quantization="int8", engine=TorchEngine()).path_chooser is None
    assert ExactScanStore(32, device="cpu", quantization="fp32").path_chooser is None
    assert ExactScanStore(32, device="cpu").scan_paths == {}


@pytest.mark.slow
def test_auto_storage_answers_a_batch_no_slower_than_fp32_here():
    """On this machine, whatever its CPU: after "auto" measured the shape, a batch over its
    int8 store is answered at least about as fast as by an fp32 store of the same rows (a
    ratio in one process, the stores timed in turn; the margin is for a shared machine)."""
    n, q = 65_536, 64
    data = unit_rows(n, 384, seed=1)
    queries = unit_rows(q, 384, seed=2)
    auto = ExactScanStore(384, device="cpu", quantization="auto", initial_rows=n)
    fp32 = ExactScanStore(384, device="cpu", quantization="fp32", initial_rows=n)
    for store in (auto, fp32):
        store.add(data, 0, [math.inf] * n)
    if auto.path_chooser is None:
        pytest.skip(f"'auto' stores {auto.quantization} here: nothing to choose")
    auto.search(queries, 4, 0)
    assert auto.path_chooser.wait_measured(timeout=300)
    times = {"auto": [], "fp32": []}
    for _ in range(5):
        for name, store in (("auto", auto), ("fp32", fp32)):
            started = time.perf_counter()
            store.search(queries, 4, 0)
            times[name].append(time.perf_counter() - started)
    assert min(times["auto"]) <= 1.5 * min(times["fp32"]), (times, auto.scan_paths)


def test_a_bucket_is_measured_at_its_largest_batch_whatever_batch_met_it():
    """A 2-query first batch once chose for every 64-query batch of its bucket; now the
    measurement scans 64 queries (the 2 repeated), as the bucket's largest batch would."""
    store, timer = measured_int8_store(3000, {"quantized": 1.0, "copy": 2.0})
    sizes = []
    search_path = store._search_path
    store._search_path = lambda path, view, queries, *rest: (
        sizes.append(queries.shape[0]),
        search_path(path, view, queries, *rest),
    )[1]
    store.search(unit_rows(2, 32, seed=8), 3, 0)
    assert sizes == [64, 64] and timer.measured == ["quantized", "copy"]


def test_a_shape_whose_scans_stray_far_from_its_measurement_is_measured_again():
    timer = ScriptedTimer({"torch": 1.0, "triton": 2.0})
    chooser = ScanKernelChooser(torch.device("cpu"), min_rows=1, timer=timer, start=INLINE)
    run = lambda kernel: kernel  # noqa: E731
    assert chooser.choose(10, 1000, run) == "torch" and timer.measured == ["torch", "triton"]
    chooser.observe(10, 1000, "torch", 3.9)  # within STRAY of the 1.0 measured: nothing
    chooser.choose(10, 1000, run)
    assert timer.measured == ["torch", "triton"]
    for _ in range(5):  # one slow scan at a time (a cold cache after other work): not enough
        chooser.observe(10, 1000, "torch", 9.0)
        chooser.observe(10, 1000, "torch", 1.2)
        chooser.choose(10, 1000, run)
    assert timer.measured == ["torch", "triton"] and chooser.remeasured == {}
    timer.seconds = {"torch": 9.0, "triton": 2.0}  # the machine changed under the measurement
    for _ in range(STRAYS_IN_A_ROW):
        chooser.observe(10, 1000, "torch", 9.0)
    assert chooser.choose(10, 1000, run) == "triton" and len(timer.measured) == 4
    for _ in range(10):  # a machine whose timings swing is measured a bounded number of times
        for _ in range(STRAYS_IN_A_ROW):
            chooser.observe(10, 1000, chooser.choices[("<=64", 4)], 1e6)
        chooser.choose(10, 1000, run)
    assert chooser.remeasured[("<=64", 4)] == 3


def test_a_measurement_waits_for_callers_scans_and_never_runs_beside_one():
    import threading

    ran = threading.Event()
    # the real timer, in a thread; waiting for the caller as long as the test needs
    chooser = ScanKernelChooser(torch.device("cpu"), min_rows=1, idle_wait=60)
    with chooser.scanning():  # a caller's scan is running
        chooser.choose(10, 1000, lambda kernel: ran.set())
        assert chooser.wait_for(lambda c: c.idle_waits >= 1, timeout=30)  # the measurement waits
        assert not ran.is_set()  # and has run nothing beside the caller's scan
    assert chooser.wait_measured(timeout=60) and ran.is_set()  # after it, the measurement ran


def test_a_process_that_exits_while_a_measurement_runs_exits_cleanly():
    """A measurement runs in a daemon thread; a script that ends right after its first large
    scan must not die with it (a torch product still running as the interpreter finalizes
    aborts the process: "terminate called without an active exception", status 134)."""
    import subprocess
    import sys

    script = (
        "import math, torch\n"
        "from gpucache.index.paths import PATH_CHOICE_MIN_ROWS\nfrom gpucache.index.store import ExactScanStore\n"
        "n, d = 4 * PATH_CHOICE_MIN_ROWS, 384\n"
        "store = ExactScanStore(d, device='cpu', quantization='int8')\n"
        "gen = torch.Generator().manual_seed(1)\n"
        "store.add(torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1), 0, [math.inf] * n)\n"
        "store.search(torch.nn.functional.normalize(torch.randn(64, d, generator=gen), dim=1), 4, 0)\n"
        "assert store.path_chooser is not None and store.path_chooser._pending  # measuring now\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
