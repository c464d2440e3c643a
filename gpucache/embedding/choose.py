"""Which forward path an embedder takes at load, and why: one place, as
``gpucache.index.engines.choose`` is for scan engines.

Four stages may change how a prompt is embedded, each tried only where it can apply and kept
only where a load-time probe agrees with the model as loaded (``AGREEMENT_MIN`` cosine on the
probe texts), so that no path moves a similarity across the threshold calibrated in fp32:

    autocast   the matmuls in fp16 (CUDA) or bf16 (a CPU with native bf16), when no dtype was
               asked for; else the dtype given, or fp32
    lean       the lean forward pass (lean.py), where the model is one it knows (BERT-like)
    single     single texts tokenized by a truncating copy of the Rust tokenizer (with lean)
    graphs     CUDA graphs of the lean pass for small batches, on CUDA only

``plan`` says which stages are tried, with the reason for each; ``EncoderPath`` says what the
probes then decided. ``gpucache info`` prints both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    tried: bool
    why: str


def plan(
    *,
    device_type: str,
    dtype_given: str | None,
    faster_dtype: str,
    lean: bool,
    lean_supported: bool,
    cuda_graphs: bool,
) -> tuple[Stage, ...]:
    """The stages to try at load, in order, each with why it is tried or not.

    ``dtype_given``: the dtype the caller asked for (None: choose); ``faster_dtype``: the
    half precision this device would run ("bfloat16", "float16") or "float32" where it has
    none; ``lean``/``cuda_graphs``: the caller's switches; ``lean_supported``: whether the lean
    pass knows this model."""
    if dtype_given is not None:
        autocast = Stage("autocast", False, f"the caller asked for {dtype_given}")
    elif faster_dtype == "float32":
        autocast = Stage("autocast", False, f"no native half precision on this {device_type}")
    else:
        autocast = Stage("autocast", True, f"{faster_dtype} matmuls, kept if they agree with fp32")
    if not lean:
        lean_stage = Stage("lean", False, "switched off by the caller (lean=False)")
    elif not lean_supported:
        lean_stage = Stage("lean", False, "the lean pass does not know this model's layers")
    else:
        lean_stage = Stage("lean", True, "a leaner pass over the same weights, kept if it agrees")
    single = Stage(
        "single",
        lean_stage.tried,
        "one text tokenized without the Python wrapper, kept if the ids are the same"
        if lean_stage.tried
        else "only with the lean pass",
    )
    if device_type != "cuda":
        graphs = Stage("graphs", False, "CUDA graphs need a CUDA device")
    elif not cuda_graphs:
        graphs = Stage("graphs", False, "switched off by the caller (cuda_graphs=False)")
    elif not lean_stage.tried:
        graphs = Stage("graphs", False, "only with the lean pass")
    else:
        graphs = Stage("graphs", True, "small batches replayed from graphs, kept if they agree")
    return autocast, lean_stage, single, graphs


@dataclass(frozen=True)
class EncoderPath:
    """The stages an embedder tried and what each came to ("kept", "dropped: ..." or the reason
    it was not tried), and the path in words."""

    stages: tuple[tuple[str, str], ...]
    summary: str

    def lines(self) -> list[str]:
        return [self.summary] + [f"{name:9s} {outcome}" for name, outcome in self.stages]
