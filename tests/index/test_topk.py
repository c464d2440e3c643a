"""block_topk and its numpy twin: the same top-k values as torch.topk, found through block
maxima."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gpucache.index.topk as topk_module
from gpucache.index.topk import BLOCK, block_topk, block_topk_numpy

Select = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def _numpy_rows_first(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout the fp32 CPU scan hands it: a C-ordered (C, Q) array."""
    values, rows = block_topk_numpy(np.ascontiguousarray(scores.numpy().T), k)
    return torch.from_numpy(values), torch.from_numpy(rows)


def _numpy_transposed_view(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A (Q, C) block passed as its transposed view, no copy."""
    values, rows = block_topk_numpy(scores.numpy().T, k)
    return torch.from_numpy(values), torch.from_numpy(rows)


def _torch_always_by_blocks(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """block_topk with no size floor, so the small cases here exercise the block path too."""
    floor, topk_module.MIN_SCORES = topk_module.MIN_SCORES, 0
    try:
        return block_topk(scores, k)
    finally:
        topk_module.MIN_SCORES = floor


def _torch_rows_first(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout torch's rows-first CPU products come in: a contiguous (C, Q) tensor."""
    return topk_module.block_topk_rows(scores.T.contiguous(), k)


def _torch_rows_first_always_by_blocks(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    floor, topk_module.MIN_SCORES = topk_module.MIN_SCORES, 0
    try:
        return _torch_rows_first(scores, k)
    finally:
        topk_module.MIN_SCORES = floor


SELECTIONS: dict[str, Select] = {
    "torch": block_topk,
    "torch-always-by-blocks": _torch_always_by_blocks,
    "torch-rows-first": _torch_rows_first,
    "torch-rows-first-always-by-blocks": _torch_rows_first_always_by_blocks,
    "numpy-rows-first": _numpy_rows_first,
    "numpy-transposed-view": _numpy_transposed_view,
}
every_selection = pytest.mark.parametrize("select", SELECTIONS.values(), ids=SELECTIONS.keys())


def _check(select: Select, scores: torch.Tensor, k: int) -> None:
    values, columns = select(scores, k)
    expected = scores.topk(k, dim=1).values
    assert values.shape == columns.shape == (scores.shape[0], k)
    assert torch.equal(values, expected)  # exact: no arithmetic, only selection
    assert torch.equal(scores.gather(1, columns), values)  # every column holds its value
    for row in columns.tolist():
        assert len(set(row)) == k  # no column picked twice


@every_selection
@pytest.mark.parametrize("q", [1, 8, 33])
@pytest.mark.parametrize("c", [1, BLOCK - 1, BLOCK, BLOCK + 1, 10 * BLOCK, 1000, 4099])
@pytest.mark.parametrize("k", [1, 4, 20])
def test_matches_torch_topk_on_awkward_shapes(select, q, c, k):
    k = min(k, c)  # the store never asks for more than the block holds
    torch.manual_seed(q * 10_000 + c * 10 + k)
    _check(select, torch.randn(q, c), k)


@every_selection
def test_masked_rows_and_ties(select):
    torch.manual_seed(0)
    scores = torch.randn(16, 5000)
    scores[:, ::3] = -math.inf  # dead rows, as the scan masks them
    scores[:, 100:200] = 0.5  # a run of ties across block boundaries
    scores[:, 4000:] = 0.5
    for k in (1, 4, 36):
        _check(select, scores, k)


@every_selection
def test_all_masked_gives_minus_infinity(select):
    values, _ = select(torch.full((9, 700), -math.inf), 4)
    assert torch.isinf(values).all() and (values < 0).all()


@pytest.mark.parametrize("select", [block_topk, _torch_always_by_blocks])
def test_bfloat16_scores(select):
    torch.manual_seed(1)
    _check(select, torch.randn(12, 3000).bfloat16(), 20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_query_over_a_wide_block_goes_by_blocks(dtype):
    """A single query over a large store: the widest block the scan makes (1M rows at Q = 1)."""
    torch.manual_seed(3)
    assert topk_module.MIN_SCORES <= 70_000
    _check(block_topk, torch.randn(1, 70_000).to(dtype), 36)


def test_a_non_contiguous_block_falls_back_to_topk():
    torch.manual_seed(2)
    _check(block_topk, torch.randn(3000, 12).T, 4)


@every_selection
def test_bad_k(select):
    with pytest.raises(ValueError, match="k must be"):
        select(torch.zeros(8, 10), 11)


@every_selection
@settings(max_examples=60, deadline=None)
@given(
    q=st.integers(1, 20),
    c=st.integers(1, 600),
    k=st.integers(1, 40),
    seed=st.integers(0, 999),
    levels=st.integers(2, 50),
)
def test_property_same_values_as_topk(select, q, c, k, seed, levels):
    k = min(k, c)
    generator = torch.Generator().manual_seed(seed)
    # few distinct levels: many ties, the hard case for a selection by block maxima
    scores = torch.randint(0, levels, (q, c), generator=generator).float()
    _check(select, scores, k)


def _scaled_case(q: int, c: int, seed: int, dead_every: int = 0):
    """int32 products with one scale per block of columns, and their float32 scores."""
    gen = torch.Generator().manual_seed(seed)
    dots = torch.randint(-6_000_000, 6_000_000, (q, c), generator=gen, dtype=torch.int32)
    scales = torch.rand((c + BLOCK - 1) // BLOCK, generator=gen) * 1e-4 + 1e-6
    if dead_every:
        dots[:, ::dead_every] = topk_module.INT32_MASKED
    scores = dots.float() * scales.repeat_interleave(BLOCK)[:c]
    if dead_every:
        scores[:, ::dead_every] = -math.inf
    return dots, scales, scores


def _check_scaled(dots, scales, scores, k, masked=True):
    values, columns = topk_module.block_topk_scaled(dots, scales, k, masked=masked)
    assert values.dtype == torch.float32 and values.shape == columns.shape == (dots.shape[0], k)
    assert torch.equal(values, scores.topk(k, dim=1).values)
    assert torch.equal(scores.gather(1, columns), values)
    for row in columns.tolist():
        assert len(set(row)) == k


@pytest.mark.parametrize("floor", [0, topk_module.MIN_SCORES])  # block path / small fallback
@pytest.mark.parametrize("q", [1, 5, 64])
@pytest.mark.parametrize("c", [1, BLOCK - 1, BLOCK, BLOCK + 1, 10 * BLOCK, 4099])
@pytest.mark.parametrize("k", [1, 4, 32])
def test_scaled_int8_products_rank_as_their_float_scores(monkeypatch, floor, q, c, k):
    """The int8 store's products: one scale per block of columns, block maxima taken in int32."""
    monkeypatch.setattr(topk_module, "MIN_SCORES", floor)
    k = min(k, c)
    dots, scales, scores = _scaled_case(q, c, seed=q * 10_000 + c * 10 + k)
    _check_scaled(dots, scales, scores, k, masked=False)


@pytest.mark.parametrize("floor", [0, topk_module.MIN_SCORES])
def test_masked_int8_products_are_never_ranked_above_live_ones(monkeypatch, floor):
    monkeypatch.setattr(topk_module, "MIN_SCORES", floor)
    dots, scales, scores = _scaled_case(16, 5000, seed=3, dead_every=3)
    for k in (1, 4, 36):
        _check_scaled(dots, scales, scores, k)
    # all masked: -inf, never a large negative number that could pass for a score
    dots, scales, scores = _scaled_case(4, 300, seed=4, dead_every=1)
    values, _ = topk_module.block_topk_scaled(dots, scales, 3)
    assert bool((values == -math.inf).all())


def test_scaled_selection_checks_its_scales():
    dots = torch.zeros((2, 130), dtype=torch.int32)
    with pytest.raises(ValueError, match="130 columns need 3 block scales"):
        topk_module.block_topk_scaled(dots, torch.ones(2), 1)
    with pytest.raises(ValueError, match="k must be"):
        topk_module.block_topk_scaled(dots, torch.ones(3), 0)


@pytest.mark.parametrize("floor", [0, topk_module.MIN_SCORES])
def test_a_fully_masked_block_never_outranks_a_live_one_whatever_its_scale(monkeypatch, floor):
    """The masked sentinel times a tiny scale is a small negative number; live products with
    a normal scale can be far below it. The live ones must still win."""
    monkeypatch.setattr(topk_module, "MIN_SCORES", floor)
    c = 4 * BLOCK
    dots = torch.full((2, c), -5_000_000, dtype=torch.int32)  # every live score very negative
    dots[:, :BLOCK] = topk_module.INT32_MASKED  # block 0: all masked, with a tiny scale
    for block, best in ((1, -4_000_000), (2, -4_100_000), (3, -4_200_000)):
        dots[:, block * BLOCK + 5] = best  # the true top 3: one in each live block
    scales = torch.tensor([1e-14, 1e-3, 1e-3, 1e-3])
    values, columns = topk_module.block_topk_scaled(dots, scales, 3)
    expected = torch.tensor([-4_000_000, -4_100_000, -4_200_000]).float() * scales[1]
    assert torch.equal(values, expected.expand(2, -1))
    assert columns.tolist() == [[BLOCK + 5, 2 * BLOCK + 5, 3 * BLOCK + 5]] * 2
