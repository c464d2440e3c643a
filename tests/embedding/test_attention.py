"""The short-prompt CPU attention computes what transformers' SDPA attention computes, and the
embedder adopts it only where its agreement check passes."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import gpucache.embedding.attention as attention_module
import gpucache.embedding.embedder as embedder_module
from gpucache.devices import cpu_has_native_bf16
from gpucache.embedding.embedder import AGREEMENT_MIN, TransformerEmbedder


class _Module(torch.nn.Module):
    is_causal = False


def _inputs(b: int, h: int, t: int, d: int, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=gen).to(dtype) for _ in range(3))
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    keep = torch.arange(t)[None, :] < lengths[:, None]  # (B, T) keys a row may attend to
    return q, k, v, keep[:, None, None, :].expand(b, 1, t, t)


@pytest.mark.parametrize("t", [1, 7, 11, 32])
@pytest.mark.parametrize("mask", ["none", "bool", "additive"])
def test_short_attention_matches_sdpa(t, mask):
    q, k, v, keep = _inputs(5, 3, t, 8, seed=t)
    masks = {
        "none": None,
        "bool": keep,
        "additive": torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min),
    }
    got, _ = attention_module.short_attention(_Module(), q, k, v, masks[mask], scaling=0.3)
    want, _ = sdpa_attention_forward(_Module(), q, k, v, masks[mask], scaling=0.3)
    assert got.shape == (5, t, 3, 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_row_with_every_key_masked_stays_finite():
    q, k, v, keep = _inputs(2, 2, 4, 8, seed=1)
    out, _ = attention_module.short_attention(_Module(), q, k, v, torch.zeros_like(keep))
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("why", ["long", "causal"])
def test_what_it_does_not_handle_goes_to_sdpa(monkeypatch, why):
    calls = []
    import transformers.integrations.sdpa_attention as sdpa

    monkeypatch.setattr(
        sdpa, "sdpa_attention_forward", lambda *a, **kw: calls.append(1) or (a[1].transpose(1, 2), None)
    )
    t = attention_module.SHORT_MAX_TOKENS + 1 if why == "long" else 4
    q, k, v, keep = _inputs(2, 2, t, 8, seed=2)
    module = _Module()
    module.is_causal = why == "causal"
    attention_module.short_attention(module, q, k, v, keep)
    assert calls == [1]


def test_the_default_embedder_takes_it_where_it_agrees():
    exact = TransformerEmbedder(device="cpu", dtype=torch.float32)
    assert exact.attention != attention_module.ATTENTION_NAME  # fp32 keeps the model's own
    if not cpu_has_native_bf16():
        pytest.skip("this CPU has no native bf16: the default stays fp32")
    default = TransformerEmbedder(device="cpu")
    assert default.attention == attention_module.ATTENTION_NAME
    assert default.agreement is not None and default.agreement >= AGREEMENT_MIN


def test_a_short_attention_that_drifts_is_not_adopted(monkeypatch):
    """Whatever the CPU claims: a drifting attention is dropped, the rest of the fast path
    is checked alone."""
    monkeypatch.setattr(embedder_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(
        attention_module,
        "short_attention",
        lambda module, q, k, v, mask, **kw: (torch.zeros_like(q).transpose(1, 2), None),
    )
    try:
        embedder = TransformerEmbedder(device="cpu")
        assert embedder.attention != attention_module.ATTENTION_NAME
        assert embedder.autocast_dtype == torch.bfloat16 and embedder.agreement >= AGREEMENT_MIN
    finally:  # transformers' registry is process-wide: the real function back for other models
        monkeypatch.undo()
        attention_module.register()
