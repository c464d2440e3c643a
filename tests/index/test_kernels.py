"""The fused scan + top-k kernel against its torch reference. On a CPU machine the kernel
runs under TRITON_INTERPRET=1 (set in conftest.py) on small, awkward shapes; with a GPU the
same tests run natively (marked gpu)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from gpucache.kernels import scan_topk, scan_topk_ref, triton_available

pytestmark = [pytest.mark.skipif(not triton_available(), reason="triton is not installed")]
if torch.cuda.is_available():
    pytestmark.append(pytest.mark.gpu)  # native on the GPU, so `pytest -m gpu` runs them

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def case(q, n, d, seed, dead_every=0):
    gen = torch.Generator().manual_seed(seed)
    queries = torch.nn.functional.normalize(torch.randn(q, d, generator=gen), dim=1)
    vectors = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
    live = torch.ones(n, dtype=torch.bool)
    if dead_every:
        live[::dead_every] = False
    return queries, vectors, live


@pytest.mark.parametrize(
    "q, n, d, k, dead_every",
    [
        (1, 1, 16, 1, 0),  # one row
        (1, 200, 40, 4, 0),  # Q = 1, N not a multiple of the block, D not of BLOCK_D
        (5, 37, 16, 50, 0),  # K > N: padded
        (33, 300, 24, 3, 3),  # Q over one query block, dead rows masked
        (3, 129, 32, 8, 2),  # N one past a block
    ],
)
def test_matches_the_reference(q, n, d, k, dead_every):
    queries, vectors, live = case(q, n, d, seed=q * 1000 + n, dead_every=dead_every)
    args = (queries.to(KERNEL_DEVICE), vectors.to(KERNEL_DEVICE), live.to(KERNEL_DEVICE), k)
    got_scores, got_rows = scan_topk(*args)
    want_scores, want_rows = scan_topk_ref(*args)
    assert got_scores.shape == got_rows.shape == (q, k)
    torch.testing.assert_close(got_scores.cpu(), want_scores.cpu(), rtol=0, atol=1e-5)
    # rows agree wherever scores are not tied
    assert torch.equal(got_rows.cpu() == -1, want_rows.cpu() == -1)
    true = (queries @ vectors.T).gather(1, got_rows.cpu().clamp(min=0))
    finite = got_scores.cpu() > -math.inf
    torch.testing.assert_close(true[finite], got_scores.cpu()[finite], rtol=0, atol=1e-5)


def test_all_rows_dead_gives_padding():
    queries, vectors, live = case(2, 50, 16, seed=3)
    live[:] = False
    scores, rows = scan_topk(queries.to(KERNEL_DEVICE), vectors.to(KERNEL_DEVICE), live.to(KERNEL_DEVICE), 3)
    assert torch.all(scores.cpu() == -math.inf) and torch.all(rows.cpu() == -1)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float16,
        pytest.param(
            torch.bfloat16,
            marks=pytest.mark.skipif(
                INTERPRETED,
                reason="Triton's CPU interpreter computes through numpy, which has no "
                "bfloat16 (it returns garbage); the bf16 path is checked natively on CUDA",
            ),
        ),
    ],
)
def test_half_precision_inputs(dtype):
    queries, vectors, live = case(4, 150, 32, seed=9)
    got, _ = scan_topk(
        queries.to(KERNEL_DEVICE, dtype), vectors.to(KERNEL_DEVICE, dtype), live.to(KERNEL_DEVICE), 4
    )
    want, _ = scan_topk_ref(queries, vectors, live, 4)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=2e-2)  # half-precision inputs


def test_bad_arguments_are_value_errors():
    queries, vectors, live = case(2, 10, 16, seed=1)
    with pytest.raises(ValueError, match="share D"):
        scan_topk(queries, vectors[:, :8], live, 1)
    with pytest.raises(ValueError, match="bool"):
        scan_topk(queries, vectors, live.int(), 1)
    with pytest.raises(ValueError, match="fp32/fp16/bf16"):
        scan_topk(queries, vectors.half(), live, 1)
    with pytest.raises(ValueError, match="k must be"):
        scan_topk(queries, vectors, live, 0)
