"""matplotlib for the reports, when the ``bench`` extra installed it.

Reports are written on headless machines (CI, GPU servers), so the non-interactive Agg backend
is chosen before pyplot is imported. Without matplotlib the reports are still written, without
their plots.
"""

from __future__ import annotations

from types import ModuleType


def headless_pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
