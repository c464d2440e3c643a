"""Attention for short prompts on the CPU, where torch's fused kernel is slowest.

Why: a cache's prompts are short (the demo's: 6 to 15 tokens), and for such sequences torch's
CPU flash-attention kernel spends its time on tiling, not arithmetic, and its softmax over
rows of a dozen values is slower than one written out. Two batched matmuls and a softmax give
the same numbers several times faster, and the whole embedder about a tenth faster, at the
same agreement with fp32 (``bench/reports/performance-notes.md``, "The embedder").

Longer sequences keep the fused kernel: the (B, H, T, T) score tensor grows with the square
of the length, and from 32 tokens the fused kernel was as fast or faster. Anything else this
function does not handle (a causal or grouped-query model, a GPU) goes to transformers' own
SDPA function unchanged.

The embedder registers it with transformers under ``ATTENTION_NAME`` and switches a model to
it only where its load-time agreement check passes with it (``TransformerEmbedder``).
"""

from __future__ import annotations

from typing import Any

import torch

ATTENTION_NAME = "gpucache_short_cpu"
SHORT_MAX_TOKENS = 32  # above this the fused kernel was as fast or faster


def short_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (B, H, T, d) inputs, (B, T, H, d) output.

    The products run in the inputs' dtype (bf16 under the embedder's autocast), the scores,
    mask and softmax in fp32."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (
        query.shape[2] > SHORT_MAX_TOKENS
        or query.device.type != "cpu"
        or dropout
        or kwargs.get("is_causal")
        or getattr(module, "is_causal", False)
        or key.shape[1] != query.shape[1]  # grouped-query attention
    ):
        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    with torch.autocast("cpu", enabled=False):
        scores = torch.matmul(query, key.transpose(-1, -2)).float()  # (B, H, T, T)
        scores.mul_(query.shape[-1] ** -0.5 if scaling is None else scaling)
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                # the lowest float, not -inf: a row with every key masked stays finite
                scores.masked_fill_(~attention_mask, torch.finfo(torch.float32).min)
            else:
                scores.add_(attention_mask)
        # softmax written out: torch's kernel is slow along rows this short (see above)
        weights = (scores - scores.amax(dim=-1, keepdim=True)).exp_()
        weights.div_(weights.sum(dim=-1, keepdim=True))
        out = torch.matmul(weights.to(value.dtype), value)  # (B, H, T, d)
    return out.transpose(1, 2).contiguous(), None


def register() -> bool:
    """Make ``ATTENTION_NAME`` known to transformers (with SDPA's masks); False where this
    transformers has no registry for attention functions."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(ATTENTION_NAME, short_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return True
