"""gpucache: a semantic cache for LLM responses that never serves the answer to a different
question. Embeds and scans on the GPU when present, on the CPU otherwise."""

from __future__ import annotations

# First, before anything loads numpy: keeps OpenBLAS's worker threads from spinning on the
# cores the embedder needs (see gpucache/blas_pool.py).
from gpucache import blas_pool  # noqa: F401

# isort: split
from gpucache.admission import AdmissionPolicy
from gpucache.cache import Hit, LoadAbandoned, SemanticCache
from gpucache.devices import resolve_device
from gpucache.embedder import Embedder, TransformerEmbedder
from gpucache.kernel_choice import ScanKernelChooser
from gpucache.keys import DEFAULT_SCOPE, prompt_key
from gpucache.lexical import LexicalNearMissVerifier
from gpucache.policy import CachePolicy, ContentPolicy, PolicyDecision, StoreEverything
from gpucache.snapshot import SnapshotError
from gpucache.stats import CacheStats
from gpucache.store import ExactScanStore
from gpucache.verifier import HitVerifier, ThresholdOnly, Verdict

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SCOPE",
    "AdmissionPolicy",
    "CachePolicy",
    "ContentPolicy",
    "LoadAbandoned",
    "PolicyDecision",
    "ScanKernelChooser",
    "StoreEverything",
    "CacheStats",
    "Embedder",
    "ExactScanStore",
    "Hit",
    "HitVerifier",
    "LexicalNearMissVerifier",
    "SemanticCache",
    "SnapshotError",
    "ThresholdOnly",
    "TransformerEmbedder",
    "Verdict",
    "prompt_key",
    "resolve_device",
]
