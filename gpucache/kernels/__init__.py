"""Triton kernels for the similarity scan, each beside its plain-torch reference.

It lives inside the package: a top-level ``kernels/`` folder in the checkout shadowed the
``kernels`` distribution that transformers imports, and the first command failed from the
repository's root. Triton is optional (the ``kernels`` extra): without it the references run.
"""

from __future__ import annotations

from gpucache.kernels.scan_topk import MAX_K, scan_topk, scan_topk_ref, triton_available

__all__ = ["MAX_K", "scan_topk", "scan_topk_ref", "triton_available"]
