"""The embedder cell: gpucache's embedder against sentence-transformers on the same model and
prompts (where sentence-transformers is installed), and against itself in plain fp32 where the
default took a faster dtype, with the cosine agreement between them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gpucache.benchmark.timing import timed_together


def bench_embedder(device: torch.device, prompts: list[str], repeat: int) -> dict[str, Any]:
    """Our embedder against sentence-transformers on the same model and prompts, and against
    itself in plain fp32 where the default took a faster dtype: all timed together
    (``timed_together``), so the ratios do not carry a shared machine's drift between them."""
    from gpucache.embedding.embedder import TransformerEmbedder
    from gpucache.embedding.model import default_model_path

    ours = TransformerEmbedder(device=device)
    engines: dict[str, Callable[[], Any]] = {"gpucache": lambda: ours.encode(prompts)}
    exact = None
    if ours.autocast_dtype is not None:  # the default took a faster path: what it costs
        exact = TransformerEmbedder(device=device, dtype=torch.float32)
        engines["fp32"] = lambda: exact.encode(prompts)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        st = None
    else:
        st = SentenceTransformer(str(default_model_path()), device=str(device))
        engines["sentence_transformers"] = lambda: st.encode(prompts, batch_size=64, convert_to_tensor=True)
    timings = dict(zip(engines, timed_together(list(engines.values()), device, repeat)))
    seconds, spread = timings["gpucache"]
    result: dict[str, Any] = {
        "prompts": len(prompts),
        "gpucache_prompts_per_s": len(prompts) / seconds,
        "gpucache_spread_s": spread,
        "dtype": str(ours.dtype)
        + (f", matmuls in {ours.autocast_dtype} (autocast)" if ours.autocast_dtype else ""),
    }
    if exact is not None:
        result["fp32_prompts_per_s"] = len(prompts) / timings["fp32"][0]
        result["min_cosine_vs_fp32"] = float((exact.encode(prompts) * ours.encode(prompts)).sum(dim=1).min())
        result["probe_min_cosine_vs_fp32"] = ours.agreement
    if st is None:
        result["sentence_transformers"] = "not installed"
        return result
    st_seconds, st_spread = timings["sentence_transformers"]
    theirs = st.encode(prompts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
    cosine = (ours.encode(prompts) * theirs.float().to(device)).sum(dim=1)
    result.update(
        sentence_transformers_prompts_per_s=len(prompts) / st_seconds,
        sentence_transformers_spread_s=st_spread,
        speedup=st_seconds / seconds,
        min_cosine=float(cosine.min()),
    )
    return result
