"""block_topk: the same top-k values as torch.topk, found through block maxima."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucache.topk import BLOCK, block_topk, block_topk_numpy


def _check(scores: torch.Tensor, k: int) -> None:
    values, columns = block_topk(scores, k)
    expected = scores.topk(k, dim=1).values
    assert values.shape == columns.shape == (scores.shape[0], k)
    assert torch.equal(values, expected)  # exact: no arithmetic, only selection
    assert torch.equal(scores.gather(1, columns), values)  # every column holds its value
    for row in columns.tolist():
        assert len(set(row)) == k  # no column picked twice


@pytest.mark.parametrize("q", [1, 8, 33])
@pytest.mark.parametrize("c", [1, BLOCK - 1, BLOCK, BLOCK + 1, 10 * BLOCK, 1000, 4099])
@pytest.mark.parametrize("k", [1, 4, 20])
def test_matches_torch_topk_on_awkward_shapes(q, c, k):
    k = min(k, c)  # the store never asks for more than the block holds
    torch.manual_seed(q * 10_000 + c * 10 + k)
    _check(torch.randn(q, c), k)


def test_masked_rows_and_ties():
    torch.manual_seed(0)
    scores = torch.randn(16, 5000)
    scores[:, ::3] = -math.inf  # dead rows, as the scan masks them
    scores[:, 100:200] = 0.5  # a run of ties across block boundaries
    scores[:, 4000:] = 0.5
    for k in (1, 4, 36):
        _check(scores, k)


def test_all_masked_gives_minus_infinity():
    scores = torch.full((9, 700), -math.inf)
    values, _ = block_topk(scores, 4)
    assert torch.isinf(values).all() and (values < 0).all()


def test_bfloat16_scores():
    torch.manual_seed(1)
    _check(torch.randn(12, 3000).bfloat16(), 20)


def test_a_non_contiguous_block_falls_back_to_topk():
    torch.manual_seed(2)
    _check(torch.randn(3000, 12).T, 4)


def test_bad_k():
    with pytest.raises(ValueError, match="k must be"):
        block_topk(torch.zeros(8, 10), 11)


@settings(max_examples=60, deadline=None)
@given(
    q=st.integers(8, 20), c=st.integers(1, 600), k=st.integers(1, 40), seed=st.integers(0, 999),
    levels=st.integers(2, 50),
)
def test_property_same_values_as_topk(q, c, k, seed, levels):
    k = min(k, c)
    generator = torch.Generator().manual_seed(seed)
    # few distinct levels: many ties, the hard case for a selection by block maxima
    scores = torch.randint(0, levels, (q, c), generator=generator).float()
    _check(scores, k)


@pytest.mark.parametrize("q", [1, 8, 33])
@pytest.mark.parametrize("c", [1, BLOCK - 1, BLOCK, BLOCK + 1, 10 * BLOCK, 1000, 4099])
@pytest.mark.parametrize("k", [1, 4, 20])
def test_the_numpy_twin_matches_torch_topk(q, c, k):
    k = min(k, c)
    torch.manual_seed(q * 10_000 + c * 10 + k + 1)
    scores = torch.randn(q, c)
    scores[:, ::5] = -math.inf
    values, columns = block_topk_numpy(scores.numpy().T, k)
    expected = scores.topk(k, dim=1).values
    assert torch.equal(torch.from_numpy(values), expected)
    assert torch.equal(scores.gather(1, torch.from_numpy(columns)), expected)
    assert all(len(set(row)) == k for row in columns.tolist())


@settings(max_examples=60, deadline=None)
@given(
    q=st.integers(1, 20), c=st.integers(1, 600), k=st.integers(1, 40), seed=st.integers(0, 999),
    levels=st.integers(2, 50),
)
def test_property_numpy_twin_same_values_as_topk(q, c, k, seed, levels):
    k = min(k, c)
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (q, c), generator=generator).float()
    values, columns = block_topk_numpy(scores.numpy().T, k)
    assert torch.equal(torch.from_numpy(values), scores.topk(k, dim=1).values)
    assert torch.equal(scores.gather(1, torch.from_numpy(columns)), torch.from_numpy(values))
    rows_first = np.ascontiguousarray(scores.numpy().T)  # the layout the scan hands it
    assert np.array_equal(block_topk_numpy(rows_first, k)[0], values)
