"""Every scan engine passes one brute-force suite: on rows of each dtype it takes, with scopes,
expired and free rows, awkward chunk sizes and k larger than the live rows, it returns a true
top-k of the rows as stored, padded with -inf / -1."""

from __future__ import annotations

import math

import pytest
import torch

from gpucache.index.codecs import make_codec
from gpucache.index.engines.base import RowsView, ScanJob
from gpucache.index.engines.choose import ChoosingEngine, default_engine
from gpucache.index.engines.int8_cpu import Int8CpuEngine
from gpucache.index.engines.numpy_engine import NumpyEngine
from gpucache.index.engines.torch_engine import TorchEngine, rows_first, torch_product
from gpucache.index.engines.triton_engine import TritonEngine
from gpucache.index.interface import FREE
from gpucache.index.kernel_choice import ScanKernelChooser
from gpucache.index.probes import INT8_GEMV_DIM, CpuPaths
from gpucache.index.scratch import ScanScratch, host_buffer
from gpucache.kernels import triton_available

# The tolerance of a returned score against the same product in fp32 over the rows as stored:
# half-precision products round each score to ~3 significant digits; int8 ranks on int8
# queries too, whose rounding moves a score by up to D x half a query step.
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-2, "bf16": 2e-2, "int8": 5e-2}


def engines_for(mode: str) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = [("torch", TorchEngine())]
    if mode == "fp32":
        found.append(("numpy", NumpyEngine()))
    if mode == "int8":
        found += [
            (f"int8-cpu-mm{m}-gemv{g}", Int8CpuEngine(matmul=m, gemv=g))
            for m in (True, False)
            for g in (True, False)
        ]
    if mode != "int8" and triton_available():
        found.append(("triton", TritonEngine()))
    return found


CASES = [
    (mode, name, engine)
    for mode in ("fp32", "fp16", "bf16", "int8")
    for name, engine in engines_for(mode)
    if not (name == "triton" and mode == "bf16")
]  # the interpreter has no bf16 (test_kernels)


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


def stored_rows(mode: str, vectors: torch.Tensor, scopes: list[int], expires: list[float]) -> RowsView:
    n, d = vectors.shape
    codec = make_codec(mode, d, n, torch.device("cpu"))
    scope_ids = torch.tensor(scopes, dtype=torch.int64)
    codec.write(list(range(n)), vectors, vectors, scope_ids)
    return RowsView(codec.data, codec.scales, scope_ids, torch.tensor(expires, dtype=torch.float64), n)


def as_stored(rows: RowsView) -> torch.Tensor:
    """The rows' values in fp32, as the codec keeps them."""
    if rows.vectors.dtype == torch.int8:
        return rows.vectors.float() * rows.scales[:, None]
    return rows.vectors.float()


def check_true_top_k(rows: RowsView, queries, k, scope_id, now, scores, found, tolerance):
    reference = queries @ as_stored(rows)[: rows.high].T  # (Q, N)
    dead = (rows.scopes[: rows.high] != scope_id) | (rows.expires[: rows.high] <= now)
    reference[:, dead] = -math.inf
    live = int((~dead).sum())
    assert scores.shape == found.shape == (queries.shape[0], k)
    for qi in range(queries.shape[0]):
        got = found[qi].tolist()
        real = [r for r in got if r >= 0]
        assert got[: len(real)] == real and all(r == -1 for r in got[len(real) :])  # padded at the end
        assert len(real) == min(k, live) and len(set(real)) == len(real)
        assert all(not bool(dead[r]) for r in real)
        assert scores[qi, len(real) :].tolist() == [-math.inf] * (k - len(real))
        torch.testing.assert_close(scores[qi, : len(real)], reference[qi, real], rtol=0, atol=tolerance)
        if real:  # nothing left out scores clearly above the last one kept
            kth = float(reference[qi, real].min())
            left_out = reference[qi].clone()
            left_out[real] = -math.inf
            assert float(left_out.max()) <= kth + 2 * tolerance


def _shapes():
    """Every engine at every shape; the Triton kernel's larger shapes run in its interpreter
    for about two minutes together, so they are marked slow (``.ci/run`` runs them; a quick
    local run may leave them out with ``-m "not slow"``)."""
    for mode, name, engine in CASES:
        # 64: rows-first products in fp32 and bf16; the most: several query blocks and a partial
        # one (the kernel's 32-query blocks: 100 in its interpreter, whose cost grows with them)
        for q in (1, 64, 100 if name == "triton" else 300):
            for chunk in (1, 7, 64, 10_000):
                for k in (1, 4, 60):
                    slow = name == "triton" and (q == 100 or chunk == 1 or k == 60)
                    yield pytest.param(
                        mode,
                        name,
                        engine,
                        q,
                        chunk,
                        k,
                        id=f"{mode}-{name}-q{q}-c{chunk}-k{k}",
                        marks=[pytest.mark.slow] if slow else [],
                    )


@pytest.mark.parametrize(("mode", "name", "engine", "q", "chunk", "k"), list(_shapes()))
def test_every_engine_returns_a_true_top_k(mode, name, engine, q, chunk, k):
    n, d = 131, 32
    vectors = unit_rows(n, d, seed=n)
    scopes = [i % 3 for i in range(n)]
    scopes[17] = FREE  # a freed row is never returned
    expires = [math.inf if i % 5 else 10.0 for i in range(n)]
    rows = stored_rows(mode, vectors, scopes, expires)
    # queries near stored rows, so the top candidates are close together: the hard case
    near = vectors[torch.arange(q) % n]
    queries = torch.nn.functional.normalize(near + 0.3 * unit_rows(q, d, 7), dim=1)
    scratch = ScanScratch()
    for scope_id in (0, 2, 5):  # 5: a scope with no rows
        with scratch.lend() as buffer:
            scores, found = engine.scan(rows, ScanJob(queries, k, scope_id, 20.0, chunk), buffer)
        check_true_top_k(rows, queries, k, scope_id, 20.0, scores, found, TOLERANCE[mode])


def test_the_choosing_engine_answers_with_whichever_it_measured_faster():
    class Timer:
        def __init__(self):
            self.measured = []

        def __call__(self, run, device):
            self.measured.append(run)
            return 0.5 if len(self.measured) % 2 == 0 else 1.0  # the second engine timed wins

    chooser = ScanKernelChooser(
        torch.device("cpu"), min_rows=1, timer=Timer(), start=lambda measure: measure()
    )
    engine = ChoosingEngine(chooser, {"torch": TorchEngine(), "triton": NumpyEngine()})
    vectors = unit_rows(200, 16, 3)
    rows = stored_rows("fp32", vectors, [0] * 200, [math.inf] * 200)
    queries = unit_rows(3, 16, 4)
    scores, found = engine.scan(rows, ScanJob(queries, 4, 0, 0.0, 64), host_buffer)
    assert list(chooser.choices.values()) == ["triton"]
    check_true_top_k(rows, queries, 4, 0, 0.0, scores, found, 1e-5)


@pytest.mark.parametrize(
    ("dtype", "q", "want"),
    [
        (torch.float32, 1, True),
        (torch.float32, 40, True),
        (torch.float32, 256, True),
        (torch.float32, 257, False),
        (torch.bfloat16, 32, False),
        (torch.bfloat16, 64, True),
        (torch.bfloat16, 128, True),
        (torch.bfloat16, 200, False),
        (torch.float16, 64, False),
    ],
)
def test_torch_products_come_rows_first_where_that_is_faster(dtype, q, want):
    assert rows_first(q, dtype) == want
    block = unit_rows(300, 16, 1).to(dtype)
    product = torch_product(unit_rows(q, 16, 2).to(dtype), block)
    if q > 1:
        assert product.T.is_contiguous() == want
    torch.testing.assert_close(
        product.float(), unit_rows(q, 16, 2).to(dtype).float() @ block.float().T, rtol=0, atol=2e-2
    )


@pytest.mark.parametrize("dim", [24, 32, 33, 48, 384])
def test_the_int8_gemv_is_taken_only_where_its_kernel_is_right(dim):
    """torch's int8 GEMV returned wrong sums or crashed for dimensions that are not multiples
    of 16: one query of another dimension takes the int8 matmul instead."""
    engine = Int8CpuEngine(matmul=True, gemv=True)
    assert engine.path(1, dim) == ("gemv" if dim % INT8_GEMV_DIM == 0 else "int32")
    assert engine.path(2, dim) == "int32"
    assert Int8CpuEngine(matmul=False, gemv=False).path(1, dim) == "widen"


def test_default_engines_follow_what_the_cpu_can_do():
    cpu = torch.device("cpu")
    amd = CpuPaths(fp32_via_numpy=True, int8_matmul=True, int8_gemv=False)
    plain = CpuPaths(fp32_via_numpy=False, int8_matmul=False, int8_gemv=False)
    assert isinstance(default_engine(cpu, torch.float32, amd), NumpyEngine)
    assert isinstance(default_engine(cpu, torch.float32, plain), TorchEngine)
    assert isinstance(default_engine(cpu, torch.int8, amd), Int8CpuEngine)
    assert isinstance(default_engine(cpu, torch.int8, plain), TorchEngine)
    assert isinstance(default_engine(cpu, torch.bfloat16, amd), TorchEngine)


def test_engines_refuse_rows_they_cannot_scan():
    rows = stored_rows("bf16", unit_rows(4, 16, 1), [0] * 4, [math.inf] * 4)
    job = ScanJob(unit_rows(1, 16, 2), 1, 0, 0.0, 4)
    with pytest.raises(ValueError, match="fp32"):
        NumpyEngine().scan(rows, job, host_buffer)
    with pytest.raises(ValueError, match="int8"):
        Int8CpuEngine(matmul=True, gemv=True).scan(rows, job, host_buffer)


def test_a_triton_launch_never_overflows_its_offsets_or_its_grid():
    """Pure integers: the kernel's 32-bit row offsets and its grid of at most 65,535 tiles."""
    from gpucache.index.engines.triton_engine import BLOCK_N, MAX_GRID_TILES, budget_rows, launch_rows

    for dim in (1, 16, 384, 768, 4096):
        rows = launch_rows(dim)
        assert rows % BLOCK_N == 0 and rows * dim < 2**31 and rows // BLOCK_N <= MAX_GRID_TILES
    assert launch_rows(384) < 5_600_000 and launch_rows(16) == MAX_GRID_TILES * BLOCK_N
    # survivors: queries x k per tile of 128 rows, 12 bytes each, within the budget
    for budget, q, k in ((64 * 2**20, 1024, 64), (2**20, 1, 4), (4096, 64, 64)):
        rows = budget_rows(budget, q, k)
        assert rows == BLOCK_N or rows // BLOCK_N * q * k * 12 <= budget


def test_int8_rows_are_widened_within_the_budget():
    from gpucache.index.engines.torch_engine import widened_rows

    assert widened_rows(64 * 2**20, 384) * 384 * 4 <= 64 * 2**20
    assert widened_rows(10, 384) == 1


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_a_k_beyond_the_kernels_tiles_goes_to_the_torch_engine():
    """A quantized store over-fetches 4k + 16 candidates: top_k = 20 asks the kernel for 96,
    more than it keeps per tile (64). Through a cache (a lookup that scans: the prompt is not
    stored as written, so the exact tier cannot answer) and on the engine alone."""
    from conftest import FakeEmbedder

    from gpucache import SemanticCache, StoreEverything, ThresholdOnly

    cache = SemanticCache(
        FakeEmbedder(dim=32),
        device="cpu",
        quantization="fp16",
        top_k=20,
        scan_kernel="triton",
        verifier=ThresholdOnly(),
        cache_policy=StoreEverything(),
    )
    cache.warm((f"stored question number {i}", str(i)) for i in range(300))
    scans = cache.stats().scans
    hit = cache.get("Stored question, number 7?")  # the same words: the same fake embedding
    assert hit is not None and hit.response == "7" and not hit.exact
    assert cache.stats().scans == scans + 1
    rows = stored_rows("fp16", unit_rows(300, 32, 1), [0] * 300, [math.inf] * 300)
    queries = unit_rows(3, 32, 2)
    scores, found = TritonEngine().scan(rows, ScanJob(queries, 96, 0, 0.0, 300), host_buffer)
    check_true_top_k(rows, queries, 96, 0, 0.0, scores, found, TOLERANCE["fp16"])
