"""The parts the index is composed of, each against its own contract: the row table, the
storage codecs, the exact copy's rescore, and the out-of-memory fallback. (The engines share
one brute-force suite, test_engines.py; the store as a whole is test_store.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from gpucache.index.codecs import INT8_SCALE_BLOCK, Codec, make_codec
from gpucache.index.fallback import MIN_SCAN_ROWS, OomFallback
from gpucache.index.interface import FREE, NEVER
from gpucache.index.refine import FullCopy, overfetch
from gpucache.index.rows import RowTable

CPU = torch.device("cpu")


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


# --------------------------------------------------------------------- row table


def test_rows_are_taken_fresh_then_reused_and_counted():
    table = RowTable(4, CPU)
    assert table.take(3) == [0, 1, 2] and (table.high, table.count) == (3, 3)
    table.assign([0, 1, 2], 5, [NEVER, 10.0, NEVER])
    table.release([1])
    assert table.count == 2 and table.expires_at(1) == NEVER and int(table.scopes[1]) == FREE
    assert table.take(2) == [1, 3]  # the freed row first, then a fresh one
    assert table.high == 4


def test_taking_past_the_allocation_is_a_bug_until_the_table_grows():
    table = RowTable(2, CPU)
    table.take(2)
    assert table.fresh_needed(1) == 1
    with pytest.raises(RuntimeError, match="beyond the allocation"):
        table.take(1)
    table.grow(2)
    assert table.capacity == 4 and table.take(1) == [2]
    assert table.expires_at(3) == NEVER and int(table.scopes[3]) == FREE


def test_expiry_is_read_back_as_written_and_listed_once_due():
    table = RowTable(4, CPU)
    rows = table.take(3)
    table.assign(rows, 0, [5.0, 10.0, NEVER])
    table.set_expiry([1], [4.0])
    assert [table.expires_at(r) for r in rows] == [5.0, 4.0, NEVER]
    assert table.expired_rows(4.0) == [1]
    assert table.expired_rows(5.0) == [0, 1]
    table.release([0])
    assert table.expired_rows(100.0) == [1]  # a freed row is never due


def test_releasing_a_free_row_is_a_bug_and_clear_forgets_everything():
    table = RowTable(4, CPU)
    table.assign(table.take(2), 1, [NEVER, 3.0])
    with pytest.raises(RuntimeError, match="not in use"):
        table.release([3])
    table.clear()
    assert (table.high, table.count) == (0, 0) and table.expires_at(1) == NEVER
    assert table.take(1) == [0]


# --------------------------------------------------------------------- codecs


@pytest.mark.parametrize(
    ("mode", "tolerance"), [("fp32", 0.0), ("fp16", 1e-3), ("bf16", 4e-3), ("int8", None)]
)
def test_a_codec_stores_rows_within_its_precision_and_keeps_them_through_growth(mode, tolerance):
    n, d = 150, 32
    vectors = unit_rows(n, d, 1)
    scopes = torch.zeros(n + 10, dtype=torch.int64)
    codec = make_codec(mode, d, 100, CPU)
    copy = torch.zeros(n + 10, d)
    copy[:100] = vectors[:100]
    codec.write(range(100), vectors[:100], copy, scopes)
    codec.grow(60)
    copy[100:n] = vectors[100:]
    codec.write(range(100, n), vectors[100:], copy, scopes)
    decoded = codec.data[:n].float()
    if mode == "int8":
        decoded = decoded * codec.scales[:n, None]
        # half a quantization step of each row's block
        tolerance = float(codec.scales[:n].max()) / 2 + 1e-7
    assert float((decoded - vectors).abs().max()) <= tolerance
    assert codec.nbytes == (n + 10) * (Codec.row_bytes(mode, d) - 16)  # scopes and expiry: rows.py


def test_int8_rows_of_a_block_share_the_scale_of_its_largest_live_row():
    d = 8
    codec = make_codec("int8", d, 2 * INT8_SCALE_BLOCK, CPU)
    scopes = torch.full((2 * INT8_SCALE_BLOCK,), FREE, dtype=torch.int64)
    copy = torch.zeros(2 * INT8_SCALE_BLOCK, d)
    copy[0], copy[1] = 0.1, 0.5
    scopes[:2] = 0
    codec.write([0, 1], copy[:2], copy, scopes)
    assert torch.equal(codec.scales[:INT8_SCALE_BLOCK], torch.full((INT8_SCALE_BLOCK,), 0.5 / 127))
    assert int(codec.data[1, 0]) == 127 and int(codec.data[0, 0]) == round(0.1 / (0.5 / 127))
    scopes[1] = FREE  # the large row leaves; the next write into the block rescales it
    copy[2] = 0.2
    scopes[2] = 0
    codec.write([2], copy[2:3], copy, scopes)
    assert float(codec.scales[0]) == pytest.approx(0.2 / 127)
    assert float(codec.scales[INT8_SCALE_BLOCK]) == 1.0  # another block: untouched


# --------------------------------------------------------------------- refine


def test_the_rescore_is_exact_ignores_padding_and_pads_to_k():
    vectors = unit_rows(10, 16, 2)
    copy = FullCopy(16, 10)
    copy.write(range(10), vectors)
    queries = unit_rows(2, 16, 3)
    candidates = torch.tensor([[3, 7, -1, 1], [-1, -1, -1, 4]])
    scores, rows = copy.rescore(queries, candidates, 3)
    exact = queries @ vectors.T
    want0 = sorted([3, 7, 1], key=lambda r: -float(exact[0, r]))
    assert rows[0].tolist() == want0
    torch.testing.assert_close(scores[0], exact[0, want0], rtol=0, atol=1e-6)
    assert rows[1].tolist() == [4, -1, -1] and scores[1, 1:].tolist() == [-math.inf] * 2
    assert overfetch(1) > 1 and overfetch(4) == 32


# --------------------------------------------------------------------- fallback


def test_out_of_memory_halves_the_chunk_then_runs_on_the_cpu():
    tried: list[int] = []

    def on_device(chunk: int) -> str:
        tried.append(chunk)
        raise torch.OutOfMemoryError("injected")

    fallback = OomFallback()
    with pytest.warns(RuntimeWarning, match="ran out of memory"):
        assert fallback.run(on_device, lambda chunk: f"cpu {chunk}", 2048) == f"cpu {MIN_SCAN_ROWS}"
    assert tried == [2048, 1024, 512, 256]
    assert (fallback.scan_retries, fallback.cpu_fallbacks) == (3, 1)


def test_a_scan_that_fits_after_a_retry_stays_on_the_device():
    fallback = OomFallback()

    def on_device(chunk: int) -> int:
        if chunk > 1000:
            raise torch.OutOfMemoryError("injected")
        return chunk

    assert fallback.run(on_device, lambda chunk: -1, 4000) == 1000
    assert (fallback.scan_retries, fallback.cpu_fallbacks) == (2, 0)


def test_other_errors_are_not_mistaken_for_out_of_memory():
    def on_device(chunk: int) -> int:
        raise RuntimeError("CUDA error: device-side assert triggered")

    with pytest.raises(RuntimeError, match="device-side"):
        OomFallback().run(on_device, lambda chunk: -1, 4000)
