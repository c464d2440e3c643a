"""Triton kernels for the similarity scan, each beside its plain-torch reference.

Installed as ``gpucache.kernels`` (the top-level ``kernels/`` folder of the repository is mapped
onto that name in ``pyproject.toml``), so it never clashes with another distribution's
``kernels`` package. The fused score + top-k kernel lands with the performance work; until then
the scan runs on torch alone (``gpucache.store``).
"""

from __future__ import annotations

__all__: list[str] = []
