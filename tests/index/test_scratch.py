"""The CPU scan keeps its product buffers between scans: the next scan writes into the same
memory, within the store's scan budget, and the answers stay exact whatever the previous scan
left there."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from gpucache import ExactScanStore
from gpucache.index.engines.numpy_engine import NumpyEngine
from gpucache.index.engines.torch_engine import TorchEngine
from gpucache.index.scratch import ScanScratch


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


def test_a_lent_buffer_is_the_same_memory_next_time():
    scratch = ScanScratch()
    with scratch.lend() as buffer:
        first = buffer(1000, torch.float32)
        first_ptr = first.data_ptr()
    with scratch.lend() as buffer:
        smaller = buffer(10, torch.float32)
        assert smaller.data_ptr() == first_ptr and smaller.numel() == 10
        other = buffer(10, torch.int32)  # another dtype: other memory
        assert other.data_ptr() != first_ptr
    assert scratch.nbytes == 1000 * 4 + 10 * 4


def test_a_larger_ask_grows_the_kept_buffer():
    scratch = ScanScratch()
    with scratch.lend() as buffer:
        buffer(10, torch.float32)
    with scratch.lend() as buffer:
        assert buffer(5000, torch.float32).numel() == 5000
    assert scratch.nbytes == 5000 * 4


def test_buffers_already_lent_out_give_a_second_scan_fresh_memory():
    """Two scans at once must never write into each other's products."""
    scratch = ScanScratch()
    with scratch.lend() as outer:
        kept = outer(100, torch.float32)
        with scratch.lend() as inner:
            fresh = inner(100, torch.float32)
            assert fresh.data_ptr() != kept.data_ptr()
    assert scratch.nbytes == 100 * 4  # only the first scan's buffer was kept


def test_keep_false_pins_nothing():
    scratch = ScanScratch()
    with scratch.lend(keep=False) as buffer:
        assert buffer(100, torch.float32).numel() == 100
    assert scratch.nbytes == 0


def test_release_gives_the_memory_back():
    scratch = ScanScratch()
    with scratch.lend() as buffer:
        buffer(100, torch.float32)
    scratch.release()
    assert scratch.nbytes == 0


def test_release_waits_for_the_scan_that_holds_the_buffers():
    scratch = ScanScratch()
    lent, done = threading.Event(), threading.Event()

    def scan() -> None:
        with scratch.lend() as buffer:
            buffer(100, torch.float32)
            lent.set()
            done.wait(5)

    worker = threading.Thread(target=scan)
    worker.start()
    lent.wait(5)
    releaser = threading.Thread(target=scratch.release)
    releaser.start()
    releaser.join(0.2)
    assert releaser.is_alive()  # blocked while the scan runs
    done.set()
    worker.join(5)
    releaser.join(5)
    assert not releaser.is_alive() and scratch.nbytes == 0


def engine_for(mode: str, via_numpy: bool):
    """fp32 rows through numpy or torch; the other modes with their own default engine."""
    if mode != "fp32":
        return None
    return NumpyEngine() if via_numpy else TorchEngine()


@pytest.mark.parametrize("mode", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("via_numpy", [True, False])
def test_a_store_keeps_its_scan_buffers_within_the_budget(mode, via_numpy):
    n, d, q, budget = 3000, 32, 40, 4 * 40 * 1000  # three chunks of 1000 rows
    store = ExactScanStore(
        d, device="cpu", quantization=mode, scan_budget_bytes=budget, engine=engine_for(mode, via_numpy)
    )
    store.add(unit_rows(n, d, 1), 0, [math.inf] * n)
    assert store.scratch.nbytes == 0
    store.search(unit_rows(q, d, 2), 4, 0)
    held = store.scratch.nbytes
    assert 0 < held <= budget  # one buffer: fp32, bf16 or int32 products
    store.search(unit_rows(q, d, 3), 4, 0)
    assert store.scratch.nbytes == held  # the same buffers again, nothing new
    store.clear()
    assert store.scratch.nbytes == 0


@pytest.mark.parametrize("mode", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("via_numpy", [True, False])
def test_answers_stay_exact_whatever_the_last_scan_left_in_the_buffers(mode, via_numpy):
    """Scans of different widths and scopes in turn: stale products from a wider scan, or from
    other rows, must never leak into the next answer."""
    n, d = 2500, 32
    vectors = unit_rows(n, d, 11)
    store = ExactScanStore(
        d,
        device="cpu",
        quantization=mode,
        scan_budget_bytes=4 * 300 * 700,
        engine=engine_for(mode, via_numpy),
    )
    store.add(vectors[:1500], 0, [math.inf] * 1500)
    store.add(vectors[1500:], 1, [math.inf] * 1000)
    for step, (q, scope) in enumerate([(300, 0), (3, 1), (150, 0), (1, 1), (300, 1), (2, 0)]):
        queries = unit_rows(q, d, 100 + step)
        scores, rows = store.search(queries, 4, scope)
        mine = vectors[:1500] if scope == 0 else vectors[1500:]
        offset = 0 if scope == 0 else 1500
        want = (queries @ mine.T).topk(4, dim=1)
        torch.testing.assert_close(scores, want.values, rtol=0, atol=1e-5)
        assert torch.equal(rows, want.indices + offset)
