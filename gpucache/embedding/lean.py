"""A lean forward pass for BERT-family encoders, over the model's own weights.

Why: a cache lookup embeds one short prompt at a time, and at batch 1 a Hugging Face forward
pass of all-MiniLM-L6-v2 spends most of its time outside its arithmetic: module calls, mask
building, attention dispatch, a dozen small tensors per layer. This pass does the same
arithmetic in fewer, larger operations: one fused QKV matmul per layer, the attention as two
batched matmuls and a softmax, no attention mask at all for a single prompt (it has no
padding), and no wrapper modules. It reads the weights of the loaded model (no second copy
of the embeddings; the QKV weights are concatenated once), so its embeddings are those of the
model up to rounding, and the embedder adopts it only where a load-time probe agrees
(``TransformerEmbedder``, ``lean_agreement``).

Only what all-MiniLM-L6-v2 and its family use is supported: ``model_type`` "bert", absolute
positions, GELU, post-LayerNorm. ``LeanEncoder.supports`` says whether a model qualifies;
anything else runs through the model itself.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F


class LeanEncoder:
    """The encoder stack of a BERT model as plain tensor operations.

    Args:
        model: a loaded ``transformers`` BertModel (its weights are shared, not copied, except
            the fused QKV weights).
        matmul_dtype: the dtype the Linear layers multiply in (the model's Linear weights are
            taken as they are; LayerNorm, softmax and the residual stream stay in fp32).
    """

    def __init__(self, model: Any, matmul_dtype: torch.dtype = torch.float32) -> None:
        if not self.supports(model):
            raise ValueError("the lean encoder runs BERT models with absolute positions and GELU")
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.eps = float(config.layer_norm_eps)
        self.matmul_dtype = matmul_dtype
        emb = model.embeddings
        self.word = emb.word_embeddings.weight
        self.position = emb.position_embeddings.weight
        self.token_type = emb.token_type_embeddings.weight[0]  # a single segment
        self.emb_norm = self._norm(emb.LayerNorm)
        self.layers = []
        for layer in model.encoder.layer:
            att = layer.attention.self
            qkv_w = torch.cat([att.query.weight, att.key.weight, att.value.weight])
            qkv_b = torch.cat([att.query.bias, att.key.bias, att.value.bias])
            self.layers.append((
                qkv_w.to(matmul_dtype), qkv_b.to(matmul_dtype),
                self._linear(layer.attention.output.dense),
                self._norm(layer.attention.output.LayerNorm),
                self._linear(layer.intermediate.dense),
                self._linear(layer.output.dense),
                self._norm(layer.output.LayerNorm),
            ))

    @staticmethod
    def _norm(module: torch.nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
        return module.weight.float(), module.bias.float()  # no copy where already fp32

    def _linear(self, module: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
        return module.weight.to(self.matmul_dtype), module.bias.to(self.matmul_dtype)

    @staticmethod
    def supports(model: Any) -> bool:
        config = getattr(model, "config", None)
        return (
            getattr(config, "model_type", None) == "bert"
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and getattr(config, "hidden_act", None) == "gelu"
            and getattr(config, "is_decoder", False) is False
            and hasattr(model, "embeddings") and hasattr(model, "encoder")
        )

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids and mask -> (B, T, D) fp32 hidden states of the last layer."""
        b, t = input_ids.shape
        x = F.embedding(input_ids, self.word) + self.position[:t] + self.token_type  # (B, T, D)
        x = F.layer_norm(x.float(), x.shape[-1:], *self.emb_norm, self.eps)
        # a single prompt, or a batch without padding, needs no mask
        bias = None
        if not bool(attention_mask.all()):
            bias = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        d = x.shape[-1]
        head = d // self.heads
        scale = 1.0 / math.sqrt(head)
        for qkv_w, qkv_b, out_p, norm1, inter_p, down_p, norm2 in self.layers:
            h = x.to(self.matmul_dtype)
            qkv = F.linear(h, qkv_w, qkv_b).view(b, t, 3, self.heads, head)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, d)
            scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale)  # (B, H, T, T)
            if bias is not None:
                scores.add_(bias)
            weights = (scores - scores.amax(dim=-1, keepdim=True)).exp_()
            weights.div_(weights.sum(dim=-1, keepdim=True))
            context = torch.matmul(weights.to(v.dtype), v)  # (B, H, T, d)
            context = context.transpose(1, 2).reshape(b, t, d)
            attended = F.linear(context, *out_p).float() + x
            x = F.layer_norm(attended, (d,), *norm1, self.eps)
            inner = F.gelu(F.linear(x.to(self.matmul_dtype), *inter_p))
            x = F.layer_norm(F.linear(inner, *down_p).float() + x, (d,), *norm2, self.eps)
        return x
