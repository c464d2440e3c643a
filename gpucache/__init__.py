"""gpucache: a semantic cache for LLM responses that never serves the answer to a different
question. Embeds and scans on the GPU when present, on the CPU otherwise.

Importing gpucache runs nothing but definitions: the public names below are loaded on first
use (PEP 562), so ``import gpucache`` loads neither torch nor numpy, and an application can
still call ``gpucache.quiet_blas_pool()`` before anything loads numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpucache.index.blas_pool import quiet_blas_pool
from gpucache.keys import DEFAULT_SCOPE, prompt_key

if TYPE_CHECKING:
    from gpucache.cache.batching import LookupTimeout
    from gpucache.cache.semantic import Hit, LoadAbandoned, SemanticCache
    from gpucache.cache.served import Found, Framed, Joined, Keep, Loaded, Served, ServeOnly, Stream
    from gpucache.cache.settings import CacheSettings
    from gpucache.cache.snapshot import SnapshotError
    from gpucache.cache.stats import CacheStats
    from gpucache.conversation.context import ContextMatcher
    from gpucache.conversation.value import Conversation, Turn
    from gpucache.devices import resolve_device
    from gpucache.embedding.embedder import TransformerEmbedder
    from gpucache.embedding.model import Embedder
    from gpucache.guard.learned import LearnedDecision
    from gpucache.guard.lexical import LexicalNearMissVerifier
    from gpucache.guard.verifier import ExplainingVerifier, HitVerifier, ThresholdOnly, Verdict
    from gpucache.index.kernel_choice import ScanKernelChooser
    from gpucache.index.store import ExactScanStore
    from gpucache.policy.admission import AdmissionPolicy
    from gpucache.policy.content import CachePolicy, ContentPolicy, PolicyDecision, StoreEverything

__version__ = "0.1.0"

_LAZY = {
    "AdmissionPolicy": "gpucache.policy.admission",
    "CachePolicy": "gpucache.policy.content",
    "CacheSettings": "gpucache.cache.settings",
    "CacheStats": "gpucache.cache.stats",
    "ContentPolicy": "gpucache.policy.content",
    "ContextMatcher": "gpucache.conversation.context",
    "Conversation": "gpucache.conversation.value",
    "Embedder": "gpucache.embedding.model",
    "ExactScanStore": "gpucache.index.store",
    "ExplainingVerifier": "gpucache.guard.verifier",
    "Found": "gpucache.cache.served",
    "Framed": "gpucache.cache.served",
    "Hit": "gpucache.cache.semantic",
    "HitVerifier": "gpucache.guard.verifier",
    "Joined": "gpucache.cache.served",
    "Keep": "gpucache.cache.served",
    "LearnedDecision": "gpucache.guard.learned",
    "LexicalNearMissVerifier": "gpucache.guard.lexical",
    "LoadAbandoned": "gpucache.cache.semantic",
    "Loaded": "gpucache.cache.served",
    "LookupTimeout": "gpucache.cache.batching",
    "PolicyDecision": "gpucache.policy.content",
    "ScanKernelChooser": "gpucache.index.kernel_choice",
    "SemanticCache": "gpucache.cache.semantic",
    "ServeOnly": "gpucache.cache.served",
    "Served": "gpucache.cache.served",
    "SnapshotError": "gpucache.cache.snapshot",
    "StoreEverything": "gpucache.policy.content",
    "Turn": "gpucache.conversation.value",
    "Stream": "gpucache.cache.served",
    "ThresholdOnly": "gpucache.guard.verifier",
    "TransformerEmbedder": "gpucache.embedding.embedder",
    "Verdict": "gpucache.guard.verifier",
    "resolve_device": "gpucache.devices",
}

__all__ = [
    "AdmissionPolicy",
    "CachePolicy",
    "CacheSettings",
    "CacheStats",
    "ContentPolicy",
    "ContextMatcher",
    "Conversation",
    "DEFAULT_SCOPE",
    "Embedder",
    "ExactScanStore",
    "ExplainingVerifier",
    "Found",
    "Framed",
    "Hit",
    "HitVerifier",
    "Joined",
    "Keep",
    "LearnedDecision",
    "LexicalNearMissVerifier",
    "LoadAbandoned",
    "Loaded",
    "LookupTimeout",
    "PolicyDecision",
    "ScanKernelChooser",
    "SemanticCache",
    "ServeOnly",
    "Served",
    "SnapshotError",
    "StoreEverything",
    "Stream",
    "ThresholdOnly",
    "TransformerEmbedder",
    "Turn",
    "Verdict",
    "prompt_key",
    "quiet_blas_pool",
    "resolve_device",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpucache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
