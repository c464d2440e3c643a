"""``EmbedderSettings``: which model embeds the prompts, where, and in what precision.

The settings a server (or any application) names its embedder by, kept apart from the
``TransformerEmbedder`` they build so a settings file or a command line can carry them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucache.fields import setting

DTYPES = ("auto", "fp32", "fp16", "bf16")


@dataclass(frozen=True)
class EmbedderSettings:
    model: str | None = setting(
        None, "the embedding model: a local folder (none: the packaged all-MiniLM-L6-v2)"
    )
    device: str = setting("auto", 'where the embedder and the index run: "auto", "cpu" or "cuda[:N]"')
    dtype: str = setting(
        "auto",
        '"auto" (fp16 on CUDA, bf16 on a CPU with native bf16, each kept only where it '
        'agrees with fp32), or "fp32", "fp16", "bf16"',
    )

    batch_size: int = setting(64, "texts per forward pass of the embedder")
    max_length: int = setting(
        256, "tokens kept per prompt; longer prompts are truncated (the model was trained on 256)"
    )
    max_batch_tokens: int = setting(
        16384, "the most rows x padded tokens one forward pass takes; a larger batch is split"
    )
    lean: bool = setting(
        True,
        "run BERT-family models through the project's fused pass, where a load-time probe "
        "agrees with the model's own",
    )
    cuda_graphs: bool = setting(
        True,
        "on CUDA, replay small batches of short prompts from CUDA graphs, where a load-time "
        "probe agrees with the eager pass",
    )

    def __post_init__(self) -> None:
        for name, least in (("batch_size", 1), ("max_length", 2), ("max_batch_tokens", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")

    def build(self) -> Any:
        """The ``TransformerEmbedder`` these settings name (loads the model)."""
        import torch

        from gpucache.embedding.embedder import TransformerEmbedder

        dtype = {"auto": None, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        return TransformerEmbedder(
            self.model,
            device=self.device,
            dtype=dtype[self.dtype],
            batch_size=self.batch_size,
            max_length=self.max_length,
            max_batch_tokens=self.max_batch_tokens,
            lean=self.lean,
            cuda_graphs=self.cuda_graphs,
        )
