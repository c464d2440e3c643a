"""A lean forward pass for BERT-family encoders, over the model's own weights.

Why: a cache lookup embeds one short prompt at a time, and at batch 1 a Hugging Face forward
pass of all-MiniLM-L6-v2 spends most of its time outside its arithmetic: module calls, mask
building, attention dispatch, a dozen small tensors per layer. This pass does the same
arithmetic in fewer, larger operations: one fused QKV matmul per layer, the attention as one
fused ``scaled_dot_product_attention``, no attention mask at all for a single prompt (it has no
padding), no wrapper modules, and on the CPU Linear weights packed once into the layout the
CPU's matrix library multiplies from (the GELU fused into the first FFN matmul). Unpacked, a
small matmul at batch 1 reorders its weight on every call, which costs about as much as the
arithmetic. It reads the weights of the loaded model (no second copy of the embeddings; the
Linear weights are taken once in the matmul dtype), so its embeddings are those of the model up
to rounding, and the embedder adopts it only where a load-time probe agrees
(``TransformerEmbedder``, ``lean_agreement``).

Only what all-MiniLM-L6-v2 and its family use is supported: ``model_type`` "bert", absolute
positions, GELU, post-LayerNorm. ``LeanEncoder.supports`` says whether a model qualifies;
anything else runs through the model itself.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

# The row count the packed layout is chosen for: a prompt of a few dozen tokens, the case the
# packing is for. Any row count multiplies correctly against it.
PACK_ROWS = 32


def packing_available(device: torch.device, dtype: torch.dtype = torch.float32) -> bool:
    """Whether Linear weights in ``dtype`` can be packed for ``device``: a CPU, with torch's
    oneDNN (mkldnn) linear ops present, and a tiny weight of that dtype packed and multiplied
    by them. Those ops are what ``torch.compile`` uses for frozen CPU Linears; they are private,
    and what they support depends on the CPU as well as the build: oneDNN packs bf16 only with
    AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, so an AVX2 machine packs fp32 and not bf16. Asking
    the ops, rather than reading CPU flags, keeps this answer and the layers' own in step."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return _packing_works(dtype)


@functools.cache
def _packing_works(dtype: torch.dtype) -> bool:
    weight = torch.eye(16, dtype=dtype)
    probe = torch.arange(32, dtype=torch.float32).reshape(2, 16).to(dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
        got = torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return got.shape == probe.shape and bool(torch.equal(got.float(), probe.float()))


class PackedLinear:
    """One Linear layer in ``dtype``, its weight packed once where ``pack`` and the probe
    agree, else multiplied by ``F.linear``. ``gelu=True`` applies the exact (erf) GELU after
    it, fused into the matmul where packed."""

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype, pack: bool) -> None:
        self.weight = weight.detach().to(dtype)
        self.bias = bias.detach().to(dtype)
        self.packed: torch.Tensor | None = None
        if pack:
            self.packed = self._pack()

    def _pack(self) -> torch.Tensor | None:
        """The packed weight, if packing works here and multiplies as ``F.linear`` does (to
        the dtype's rounding) on a probe input; else None."""
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, PACK_ROWS)
            probe = torch.linspace(-1.0, 1.0, 3 * self.weight.shape[1]).reshape(3, -1)
            probe = probe.to(self.weight.dtype)
            got = torch.ops.mkldnn._linear_pointwise(probe, packed, self.bias, "none", [], "")
        except (RuntimeError, AttributeError, NotImplementedError):
            return None
        want = F.linear(probe, self.weight, self.bias)
        tol = 1e-3 if self.weight.dtype == torch.float32 else 5e-2
        if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol):
            return None
        return packed

    def __call__(self, x: torch.Tensor, gelu: bool = False) -> torch.Tensor:
        if self.packed is not None:
            if gelu:
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "gelu", [], "none")
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        y = F.linear(x, self.weight, self.bias)
        return F.gelu(y) if gelu else y


class LeanEncoder:
    """The encoder stack of a BERT model as plain tensor operations.

    Args:
        model: a loaded ``transformers`` BertModel (its embedding tables and LayerNorm weights
            are shared, not copied; the Linear weights are taken in ``matmul_dtype``, with
            the QKV weights concatenated, and packed on the CPU where ``pack``).
        matmul_dtype: the dtype the Linear layers and the attention multiply in; LayerNorm
            and the residual stream stay in fp32.
        pack: pack the Linear weights for the CPU's matrix library (``packing_available``).
            None: wherever it is available for ``matmul_dtype``.
    """

    def __init__(
        self, model: Any, matmul_dtype: torch.dtype = torch.float32, pack: bool | None = None
    ) -> None:
        if not self.supports(model):
            raise ValueError("the lean encoder runs BERT models with absolute positions and GELU")
        config = model.config
        device = model.embeddings.word_embeddings.weight.device
        if pack is None:
            pack = packing_available(device, matmul_dtype)
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
            self.layers.append(
                (
                    PackedLinear(qkv_w, qkv_b, matmul_dtype, pack),
                    self._linear(layer.attention.output.dense, pack),
                    self._norm(layer.attention.output.LayerNorm),
                    self._linear(layer.intermediate.dense, pack),
                    self._linear(layer.output.dense, pack),
                    self._norm(layer.output.LayerNorm),
                )
            )
        self.packed = any(
            linear.packed is not None
            for layer in self.layers
            for linear in layer
            if isinstance(linear, PackedLinear)
        )

    @staticmethod
    def _norm(module: torch.nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
        return module.weight.float(), module.bias.float()  # no copy where already fp32

    def _linear(self, module: torch.nn.Linear, pack: bool) -> PackedLinear:
        return PackedLinear(module.weight, module.bias, self.matmul_dtype, pack)

    @staticmethod
    def supports(model: Any) -> bool:
        config = getattr(model, "config", None)
        return (
            getattr(config, "model_type", None) == "bert"
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and getattr(config, "hidden_act", None) == "gelu"
            and getattr(config, "is_decoder", False) is False
            and hasattr(model, "embeddings")
            and hasattr(model, "encoder")
        )

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, masked: bool | None = None
    ) -> torch.Tensor:
        """(B, T) token ids and mask -> (B, T, D) fp32 hidden states of the last layer.

        ``masked``: whether to apply the mask; None decides by looking (a host sync), True
        always applies it (a CUDA graph cannot look, ``gpucache.embedding.graphs``)."""
        b, t = input_ids.shape
        x = F.embedding(input_ids, self.word) + self.position[:t] + self.token_type  # (B, T, D)
        x = F.layer_norm(x.float(), x.shape[-1:], *self.emb_norm, self.eps)
        # a single prompt, or a batch without padding, needs no mask; padded keys are masked
        # out (every row has at least one real token, so no row is all masked)
        if masked is None:
            masked = not bool(attention_mask.all())
        keep = attention_mask[:, None, None, :].bool() if masked else None  # (B, 1, 1, T)
        d = x.shape[-1]
        head = d // self.heads
        for qkv_p, out_p, norm1, inter_p, down_p, norm2 in self.layers:
            qkv = qkv_p(x.to(self.matmul_dtype)).view(b, t, 3, self.heads, head)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, d)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B, H, T, d)
            context = context.transpose(1, 2).reshape(b, t, d)
            x = F.layer_norm(out_p(context).float() + x, (d,), *norm1, self.eps)
            inner = inter_p(x.to(self.matmul_dtype), gelu=True)
            x = F.layer_norm(down_p(inner).float() + x, (d,), *norm2, self.eps)
        return x
