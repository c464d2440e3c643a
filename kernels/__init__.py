"""Triton kernels for the similarity scan, each beside its plain-torch reference.

Installed as ``gpucache.kernels`` (the top-level ``kernels/`` folder of the repository is mapped
onto that name in ``pyproject.toml``), so it never clashes with another distribution's
``kernels`` package. Triton is optional (the ``kernels`` extra): without it the references run.
"""

from __future__ import annotations

from gpucache.kernels.scan_topk import MAX_K, scan_topk, scan_topk_ref, triton_available

__all__ = ["MAX_K", "scan_topk", "scan_topk_ref", "triton_available"]
