"""ExactScanStore: the scan returns exactly what a brute-force sort would, within scope and
expiry, whatever the chunking."""

from __future__ import annotations

import math

import pytest
import torch

from gpucache import ExactScanStore
from gpucache.index.codecs import INT8_SCALE_BLOCK
from gpucache.index.engines.int8_cpu import Int8CpuEngine
from gpucache.index.engines.numpy_engine import NumpyEngine
from gpucache.index.engines.torch_engine import TorchEngine
from gpucache.index.interface import FREE
from gpucache.index.refine import SMALL_INDEX_MAX_ROWS, SMALL_INDEX_MIN_QUERIES, RefinePolicy


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


def brute_force(queries, vectors, scopes, expires, k, scope_id, now):
    scores = queries @ vectors.T
    dead = (torch.tensor(scopes) != scope_id) | (torch.tensor(expires, dtype=torch.float64) <= now)
    scores[:, dead] = -math.inf
    kk = min(k, vectors.shape[0])
    top, rows = scores.topk(kk, dim=1)
    pad = k - kk
    top = torch.cat([top, torch.full((queries.shape[0], pad), -math.inf)], dim=1)
    rows = torch.cat([rows, torch.full((queries.shape[0], pad), -1, dtype=torch.int64)], dim=1)
    rows[top == -math.inf] = -1
    return top, rows


def chunk_budget(rows_per_chunk: int, q: int) -> int:
    return 4 * q * rows_per_chunk


from gpucache.kernels import triton_available  # noqa: E402

KERNELS = ["auto", "torch"] + (["triton"] if triton_available() else [])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rows_per_chunk", [1, 7, 64, 10_000])
@pytest.mark.parametrize("n", [1, 2, 50, 131])
@pytest.mark.parametrize("k", [1, 4, 60])
def test_search_matches_brute_force_for_awkward_chunks(device, kernel, rows_per_chunk, n, k):
    d, q = 16, 5
    vectors = unit_rows(n, d, seed=n)
    queries = unit_rows(q, d, seed=1000 + n)
    scopes = [i % 3 for i in range(n)]
    expires = [math.inf if i % 5 else 10.0 for i in range(n)]
    store = ExactScanStore(
        d,
        device=device,
        initial_rows=3,
        scan_budget_bytes=chunk_budget(rows_per_chunk, q),
        scan_kernel=kernel,
    )
    for i in range(n):
        assert store.add(vectors[i : i + 1], scopes[i], [expires[i]]) == [i]
    for scope_id in range(3):
        got_scores, got_rows = store.search(queries.to(device), k, scope_id, now=20.0)
        want_scores, want_rows = brute_force(queries, vectors, scopes, expires, k, scope_id, 20.0)
        assert got_scores.shape == got_rows.shape == (q, k)
        torch.testing.assert_close(got_scores.cpu(), want_scores, rtol=0, atol=1e-5)
        assert torch.equal(got_rows.cpu(), want_rows)


def test_empty_store_pads_with_minus_inf_and_minus_one(device):
    store = ExactScanStore(8, device=device)
    scores, rows = store.search(unit_rows(3, 8, 0).to(device), 4, scope_id=0)
    assert scores.shape == (3, 4)
    assert torch.all(scores == -math.inf) and torch.all(rows == -1)


def test_zero_queries_give_empty_results(device):
    store = ExactScanStore(8, device=device)
    store.add(unit_rows(2, 8, 0), 0, [math.inf, math.inf])
    scores, rows = store.search(torch.empty((0, 8)), 3, scope_id=0)
    assert scores.shape == rows.shape == (0, 3)


@pytest.mark.parametrize("kernel", KERNELS)
def test_ties_keep_every_tied_row_once(device, kernel):
    store = ExactScanStore(4, device=device, scan_budget_bytes=chunk_budget(2, 1), scan_kernel=kernel)
    v = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    store.add(v.repeat(5, 1), 0, [math.inf] * 5)
    scores, rows = store.search(v.to(device), 5, scope_id=0)
    assert torch.allclose(scores.cpu(), torch.ones(1, 5))
    assert sorted(rows.cpu().flatten().tolist()) == [0, 1, 2, 3, 4]


def test_removed_rows_are_never_returned_and_are_reused(device):
    store = ExactScanStore(8, device=device, initial_rows=2)
    vectors = unit_rows(6, 8, 3)
    rows = store.add(vectors, 0, [math.inf] * 6)
    store.remove([rows[1], rows[4]])
    assert len(store) == 4
    _, found = store.search(vectors.to(device), 6, scope_id=0)
    assert not ({rows[1], rows[4]} & set(found.flatten().tolist()))
    again = store.add(unit_rows(2, 8, 4), 0, [math.inf] * 2)
    assert sorted(again) == sorted([rows[1], rows[4]])
    assert len(store) == 6


def test_removing_a_free_row_is_a_bug_not_silence(device):
    store = ExactScanStore(8, device=device)
    store.add(unit_rows(1, 8, 0), 0, [math.inf])
    store.remove([0])
    with pytest.raises(RuntimeError, match="gpucache bug"):
        store.remove([0])


@pytest.mark.parametrize("kernel", KERNELS)
def test_expired_rows_are_masked_and_listed(device, kernel):
    store = ExactScanStore(8, device=device, scan_kernel=kernel)
    vectors = unit_rows(3, 8, 5)
    store.add(vectors, 0, [5.0, math.inf, 10.0])
    _, rows = store.search(vectors[:1].to(device), 3, scope_id=0, now=7.0)
    assert 0 not in rows.flatten().tolist() and 1 in rows.flatten().tolist()
    assert store.expired_rows(7.0) == [0]
    assert store.expired_rows(10.0) == [0, 2]
    store.set_expiry([0], [math.inf])
    assert store.expired_rows(10.0) == [2]


def test_growth_keeps_existing_rows(device):
    store = ExactScanStore(8, device=device, initial_rows=1)
    vectors = unit_rows(40, 8, 6)
    for i in range(40):
        store.add(vectors[i : i + 1], 0, [math.inf])
    scores, rows = store.search(vectors.to(device), 1, scope_id=0)
    assert rows.flatten().tolist() == list(range(40))
    torch.testing.assert_close(scores.cpu().flatten(), torch.ones(40), rtol=0, atol=1e-5)


def test_bad_shapes_and_arguments_raise_value_error(device):
    store = ExactScanStore(8, device=device)
    with pytest.raises(ValueError, match=r"\(M, 8\)"):
        store.add(torch.zeros(2, 7), 0, [math.inf, math.inf])
    with pytest.raises(ValueError, match="expires_at"):
        store.add(torch.zeros(2, 8), 0, [math.inf])
    with pytest.raises(ValueError, match=r"\(Q, 8\)"):
        store.search(torch.zeros(2, 7), 1, 0)
    with pytest.raises(ValueError, match="k must be"):
        store.search(torch.zeros(2, 8), 0, 0)
    with pytest.raises(ValueError, match="dim"):
        ExactScanStore(0)


# --------------------------------------------------------------------- quantized storage


@pytest.mark.parametrize("small_index_rows", [{}, SMALL_INDEX_MAX_ROWS])
@pytest.mark.parametrize("q", [1, 40, 150])  # 150: the rescore's query blocks, one ragged
@pytest.mark.parametrize("mode", ["fp16", "bf16", "int8"])
def test_quantized_scores_are_exact_and_recall_matches_fp32(device, mode, q, small_index_rows):
    # small_index_rows {}: every bf16/int8 batch scans the quantized rows and rescores; at the
    # default, a CPU batch of 150 queries over these 2000 rows scans the exact copy instead
    d, n, k = 32, 2000, 4
    vectors = unit_rows(n, d, seed=11)
    # queries near stored rows, so the top candidates are close together: the hard case
    queries = torch.nn.functional.normalize(vectors[:q] + 0.3 * unit_rows(q, d, seed=12), dim=1)
    exact = ExactScanStore(d, device=device)
    quant = ExactScanStore(
        d,
        device=device,
        quantization=mode,
        scan_budget_bytes=4 * q * 97,
        refine=RefinePolicy(small_index_rows=small_index_rows),
    )
    for store in (exact, quant):
        store.add(vectors, 0, [math.inf] * n)
    want_scores, want_rows = exact.search(queries.to(device), k, 0)
    got_scores, got_rows = quant.search(queries.to(device), k, 0)
    # every score the cache sees is the full-precision one: quantization cannot cause a hit
    true = (queries @ vectors.T).gather(1, got_rows.cpu().clamp(min=0))
    torch.testing.assert_close(got_scores.cpu(), true, rtol=0, atol=1e-5)
    recall = sum(len(set(a) & set(b)) for a, b in zip(got_rows.tolist(), want_rows.tolist()))
    assert recall / (q * k) >= 0.99


def test_the_refine_policy_scans_the_exact_copy_only_where_that_is_cheaper():
    """fp16 CPU batches always (no fast fp16 product on x86); bf16/int8 only for a small index
    asked many queries at once; never for one query, on CUDA, or with the Triton kernel."""
    policy = RefinePolicy()
    many = SMALL_INDEX_MIN_QUERIES
    assert policy.scans_copy("fp16", True, True, 2, 10**6)
    assert not policy.scans_copy("fp16", True, True, 1, 10)
    for mode in ("bf16", "int8"):
        small = SMALL_INDEX_MAX_ROWS[mode]
        assert policy.scans_copy(mode, True, True, many, small)
        assert not policy.scans_copy(mode, True, True, many, small + 1)
        assert not policy.scans_copy(mode, True, True, many - 1, small)
        assert not policy.scans_copy(mode, False, True, many, small)  # a CUDA index
        assert not policy.scans_copy(mode, True, False, many, small)  # the Triton kernel
    assert not RefinePolicy(small_index_rows={}).scans_copy("int8", True, True, many, 10)


@pytest.mark.parametrize("mode", ["bf16", "int8"])
def test_a_small_cpu_store_answers_a_large_batch_from_its_exact_copy(mode):
    """Where the rescore would cost more than the quantized product saves, a bf16/int8 CPU
    store ranks by exact scores: exactly the fp32 store's answer. Past the size it scans the
    quantized rows, and the rescored answer is exact too."""
    d, n = 32, 3000
    vectors = unit_rows(n, d, seed=31)
    queries = unit_rows(SMALL_INDEX_MIN_QUERIES, d, seed=32)
    exact = ExactScanStore(d, device="cpu")
    small = ExactScanStore(d, device="cpu", quantization=mode)
    past = ExactScanStore(
        d, device="cpu", quantization=mode, refine=RefinePolicy(small_index_rows={mode: n - 1})
    )
    for store in (exact, small, past):
        store.add(vectors, 0, [math.inf] * n)
    want = exact.search(queries, 4, 0)
    torch.testing.assert_close(small.search(queries, 4, 0), want, rtol=0, atol=0)
    scores, rows = past.search(queries, 4, 0)
    torch.testing.assert_close(scores, (queries @ vectors.T).gather(1, rows), rtol=0, atol=1e-5)
    assert torch.equal(rows, want[1])


@pytest.mark.parametrize("d", [24, 48, 384])
@pytest.mark.parametrize("gemv", [True, False])
def test_a_single_int8_query_is_exact_whatever_the_dimension(d, gemv):
    """One query against int8 rows, through the GEMV where the engine takes it and through the
    int8 matmul elsewhere: either way the scores are the exact ones."""
    n = 1001  # not a multiple of anything the kernel blocks by
    vectors = unit_rows(n, d, seed=41)
    query = torch.nn.functional.normalize(vectors[7:8] + 0.3 * unit_rows(1, d, seed=42), dim=1)
    exact = ExactScanStore(d, device="cpu")
    quant = ExactScanStore(d, device="cpu", quantization="int8", engine=Int8CpuEngine(matmul=True, gemv=gemv))
    for store in (exact, quant):
        store.add(vectors, 0, [math.inf] * n)
    scores, rows = quant.search(query, 4, 0)
    torch.testing.assert_close(scores, (query @ vectors.T).gather(1, rows), rtol=0, atol=1e-5)
    assert rows.tolist() == exact.search(query, 4, 0)[1].tolist()


@pytest.mark.parametrize("mode", ["fp32", "fp16", "bf16", "int8"])
def test_quantized_modes_keep_scopes_expiry_and_padding(device, mode):
    store = ExactScanStore(8, device=device, quantization=mode)
    vectors = unit_rows(3, 8, 21)
    store.add(vectors[:2], 0, [math.inf, 5.0])
    store.add(vectors[2:], 1, [math.inf])
    scores, rows = store.search(vectors.to(device), 3, 0, now=10.0)
    assert rows[0].tolist() == [0, -1, -1]
    assert scores[0, 1:].tolist() == [-math.inf, -math.inf]
    assert 2 not in rows.flatten().tolist()
    torch.testing.assert_close(store.vectors([0]).cpu(), vectors[:1], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "mode, device_bytes, host_bytes",
    [
        ("fp32", 4 * 384 + 16, 0),
        ("fp16", 2 * 384 + 16, 4 * 384),
        ("bf16", 2 * 384 + 16, 4 * 384),
        ("int8", 384 + 20, 4 * 384),
    ],
)
def test_memory_per_row_is_as_documented(mode, device_bytes, host_bytes):
    store = ExactScanStore(384, device="cpu", quantization=mode, initial_rows=100)
    assert store.row_bytes == device_bytes
    assert store.nbytes == 100 * device_bytes
    assert store.host_nbytes == 100 * host_bytes


def test_max_device_bytes_caps_the_allocation():
    store = ExactScanStore(16, device="cpu", initial_rows=4, max_device_bytes=80 * 10 + 5)
    assert store.max_rows == 10
    store.add(unit_rows(10, 16, 1), 0, [math.inf] * 10)
    assert store.nbytes <= 80 * 10 + 5
    with pytest.raises(RuntimeError, match="capped"):
        store.add(unit_rows(1, 16, 2), 0, [math.inf])
    with pytest.raises(ValueError, match="one row"):
        ExactScanStore(16, max_device_bytes=10)
    with pytest.raises(ValueError, match="quantization"):
        ExactScanStore(16, quantization="fp8")


CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # a device object only: resolving a mode touches no GPU


@pytest.mark.parametrize(
    "given, device, dim, cap, kernel, gemv, mode",
    [
        (None, CPU, 384, None, "auto", True, "fp32"),  # None is full precision, as always
        ("bf16", CPU, 384, None, "auto", True, "bf16"),  # an explicit mode is kept
        ("auto", CPU, 384, None, "auto", True, "int8"),  # a CPU: a quarter of the bytes per lookup
        ("auto", CPU, 384, None, "torch", True, "int8"),
        ("auto", CPU, 384, 10**9, "auto", True, "fp32"),  # capped: the fp32 copy shares the RAM
        ("auto", CPU, 24, None, "auto", True, "fp32"),  # no int8 GEMV for this dimension
        ("auto", CPU, 384, None, "auto", False, "fp32"),  # no int8 GEMV in this torch
        ("auto", CPU, 384, None, "triton", True, "fp32"),  # the kernel scans no int8
        ("auto", CUDA, 384, None, "auto", True, "fp32"),  # exact, no host copy, already fast
    ],
)
def test_auto_quantization_is_int8_on_a_cpu_and_fp32_elsewhere(
    monkeypatch, given, device, dim, cap, kernel, gemv, mode
):
    from gpucache.index.paths import resolve_quantization
    from gpucache.index.probes import CpuPaths

    paths = CpuPaths(fp32_via_numpy=False, int8_matmul=True, int8_gemv=gemv)
    monkeypatch.setattr(CpuPaths, "detect", staticmethod(lambda: paths))
    assert resolve_quantization(given, device, dim, cap, kernel) == mode


def test_an_auto_store_says_which_mode_it_took_and_scans_exactly():
    from gpucache.index.probes import CpuPaths

    store = ExactScanStore(384, device="cpu", quantization="auto", initial_rows=64)
    expected = "int8" if CpuPaths.detect().int8_gemv_for(384) else "fp32"
    assert store.quantization == expected
    rows = unit_rows(500, 384, 11)
    store.add(rows, 0, [math.inf] * 500)
    query = rows[123:124]
    scores, found = store.search(query, 3, 0, 0.0)
    assert int(found[0, 0]) == 123
    assert float(scores[0, 0]) == pytest.approx(float(rows[123] @ rows[123]), abs=1e-6)
    with pytest.raises(ValueError, match="quantization"):
        ExactScanStore(16, quantization="Auto")


@pytest.mark.parametrize("engine", [NumpyEngine(), TorchEngine()], ids=["numpy", "torch"])
@pytest.mark.parametrize("q", [1, 7, 40, 300])
@pytest.mark.parametrize("chunk_rows", [64, 1000, 5000])
def test_both_scan_loops_agree_with_brute_force_on_masked_rows(engine, q, chunk_rows):
    """Wide blocks (the block-maxima top-k), both product orientations (Q <= 256 and above),
    several scopes and expired rows, on the numpy loop and on the torch loop."""
    n = 4099
    vectors = unit_rows(n, 24, 41)
    queries = unit_rows(q, 24, 42)
    scopes = [i % 3 for i in range(n)]
    expires = [5.0 if i % 7 == 0 else math.inf for i in range(n)]
    store = ExactScanStore(24, device="cpu", scan_budget_bytes=chunk_budget(chunk_rows, q), engine=engine)
    for scope in range(3):
        rows = [i for i in range(n) if scopes[i] == scope]
        store.add(vectors[rows], scope, [expires[i] for i in rows])
    order = [i for scope in range(3) for i in range(n) if scopes[i] == scope]  # store row -> input
    for scope in (0, 2):
        scores, rows = store.search(queries, 6, scope, now=10.0)
        want_scores, _ = brute_force(queries, vectors, scopes, expires, 6, scope, 10.0)
        torch.testing.assert_close(scores, want_scores, rtol=0, atol=1e-5)
        for i, row in enumerate(rows[0].tolist()):  # each row found holds its score
            original = order[row]
            assert scopes[original] == scope and expires[original] > 10.0
            assert abs(float(queries[0] @ vectors[original]) - float(scores[0, i])) < 1e-5


@pytest.mark.parametrize("paths", [(True, True), (True, False), (False, True), (False, False)])
def test_every_int8_scan_path_keeps_recall_and_exact_scores(paths):
    """int8 rows are scanned with an int8 x int8 matmul where torch has one on the CPU, else
    widened to fp32; both rank well enough for the fp32 rescore to find the true top-k."""
    d, n, q, k = 48, 3000, 30, 4
    vectors = unit_rows(n, d, seed=41)
    queries = torch.nn.functional.normalize(vectors[:q] + 0.3 * unit_rows(q, d, seed=42), dim=1)
    store = ExactScanStore(
        d, device="cpu", quantization="int8", engine=Int8CpuEngine(matmul=paths[0], gemv=paths[1])
    )
    store.add(vectors, 0, [math.inf] * n)
    for batch in (queries, queries[:1]):
        scores, rows = store.search(batch, k, 0)
        want = (batch @ vectors.T).topk(k, dim=1)
        torch.testing.assert_close(scores, want.values, rtol=0, atol=1e-5)
        recall = sum(len(set(a) & set(b)) for a, b in zip(rows.tolist(), want.indices.tolist()))
        assert recall / (batch.shape[0] * k) >= 0.99


def _assert_block_scales(store: ExactScanStore) -> None:
    """Every block of int8 rows has one scale, its live rows' largest magnitude / 127, and every
    live row dequantizes to within half a step of its fp32 copy."""
    size, codec = INT8_SCALE_BLOCK, store.codec
    for first in range(0, store.rows.high, size):
        rows = torch.arange(first, min(first + size, codec.data.shape[0]))
        block_live = rows[store.rows.scopes[rows] != FREE]
        if len(block_live) == 0:
            continue
        scales = codec.scales[rows]
        assert bool((scales == scales[0]).all()), f"block at row {first} has several scales"
        full = store.copy.data[block_live]
        torch.testing.assert_close(scales[0], full.abs().max() / 127.0)
        error = (codec.data[block_live].float() * scales[0] - full).abs().max()
        assert float(error) <= float(scales[0]) / 2 + 1e-7


def test_int8_rows_share_one_scale_per_block_whatever_the_order_of_adds():
    d = 16
    store = ExactScanStore(d, device="cpu", quantization="int8", initial_rows=8)
    gen = torch.Generator().manual_seed(5)
    for step, m in enumerate([1, 3, 70, 1, 130, 2]):  # growth, blocks filled across adds
        magnitude = 0.05 if step % 2 else 1.0  # small rows joining blocks of large ones
        rows = torch.randn(m, d, generator=gen) * magnitude
        store.add(rows, step % 2, [math.inf] * m)
        _assert_block_scales(store)


def test_a_larger_row_requantizes_its_block_and_a_smaller_block_regains_precision():
    d = 16
    store = ExactScanStore(d, device="cpu", quantization="int8")
    small = torch.full((1, d), 0.01)
    store.add(small, 0, [math.inf])
    assert int(store.codec.data[0, 0]) == 127  # the block's only row: its own full scale
    (big_row,) = store.add(torch.full((1, d), 0.5), 0, [math.inf])
    assert int(store.codec.data[0, 0]) == round(0.01 / (0.5 / 127))  # re-quantized: 3 steps
    _assert_block_scales(store)
    store.remove([big_row])
    store.add(small * 3, 0, [math.inf])  # the next row to join the block rescales it
    assert int(store.codec.data[0, 0]) == round(0.01 / (0.03 / 127))  # 42 steps, not 3
    _assert_block_scales(store)


def test_int8_search_is_exact_and_finds_small_rows_beside_large_ones():
    """Rows far smaller than the largest of their block still rank: the over-fetch and the
    fp32 rescore absorb the coarser steps, and masked rows never come back."""
    d, n = 48, 3000
    vectors = unit_rows(n, d, seed=61)
    vectors[::2] *= 0.2  # every other row much smaller than its neighbours
    queries = torch.nn.functional.normalize(vectors[:40] + 0.05 * unit_rows(40, d, 62), dim=1)
    store = ExactScanStore(d, device="cpu", quantization="int8")
    store.add(vectors, 0, [5.0 if i % 7 == 0 else math.inf for i in range(n)])
    scores, rows = store.search(queries, 4, 0, now=10.0)
    want = queries @ vectors.T
    want[:, ::7] = -math.inf
    want = want.topk(4, dim=1)
    torch.testing.assert_close(scores, want.values, rtol=0, atol=1e-5)
    assert torch.equal(rows, want.indices)


@pytest.mark.parametrize("mode", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("precision", ["high", "medium"])
def test_scores_stay_exact_when_the_process_lowers_fp32_matmul_precision(mode, precision):
    """An application may lower torch's fp32 matmul precision process-wide (TF32 on a GPU, bf16
    on a CPU that has it); the scores the cache compares with its threshold stay exact."""
    n, d = 3000, 64
    vectors = unit_rows(n, d, seed=81)
    queries = torch.nn.functional.normalize(vectors[:40] + 0.2 * unit_rows(40, d, 82), dim=1)
    store = ExactScanStore(d, device="cpu", quantization=mode)
    store.add(vectors, 0, [math.inf] * n)
    want = (queries.double() @ vectors.double().T).topk(4, dim=1)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        for batch in (queries, queries[:1]):
            scores, rows = store.search(batch, 4, 0)
            exact = (batch.double()[:, None, :] * vectors.double()[rows]).sum(-1)
            torch.testing.assert_close(scores.double(), exact, rtol=0, atol=1e-6)
        assert torch.equal(store.search(queries, 4, 0)[1], want.indices)
    finally:
        torch.set_float32_matmul_precision(before)
