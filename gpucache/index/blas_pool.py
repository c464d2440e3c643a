"""Keep numpy's OpenBLAS worker threads from spinning on the cores torch needs.

Why: on AMD CPUs the fp32 scan can multiply through numpy's OpenBLAS (the numpy engine, see
``engines/``) while the embedder runs in torch, one after the other on the same cores.
OpenBLAS's worker threads busy-wait for about 2^28 cycles (a tenth of a second) after every
product before they sleep, and in that time they take the cores from torch's threads: the
embedding right after a scan, and so ``get_or_put_all``, ran at about half speed
(``bench/reports/performance-notes.md``).

``OPENBLAS_THREAD_TIMEOUT=4`` (2^4 cycles) puts them to sleep at once. OpenBLAS reads it once,
when it is loaded, that is when numpy is first imported (torch imports numpy). So it is the
application's setting, made explicit in one of two ways:

- set ``OPENBLAS_THREAD_TIMEOUT=4`` in the process's environment (the ``gpucache`` command
  does this for itself before it imports anything else); or
- call ``gpucache.quiet_blas_pool()`` first thing, before numpy is imported.

gpucache itself writes nothing at import. The engines read ``blas_pool_quiet()`` when the first
CPU index is built: where the pool spins, the fp32 scan stays in torch, which never hands the
cores to a spinning pool.

This module imports neither numpy nor torch: it must be usable before them.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "OPENBLAS_THREAD_TIMEOUT"
QUIET_TIMEOUT = "4"  # OpenBLAS's minimum: 2^4 cycles of spinning before a worker sleeps
MAX_QUIET = 16  # 2^16 cycles, about 20 microseconds: still quiet


def quiet_blas_pool() -> bool:
    """Ask OpenBLAS's pool to sleep as soon as it is idle, unless the environment already
    says otherwise. It takes effect only before numpy is first imported; returns whether the
    pool in this process sleeps promptly (``blas_pool_quiet()``)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault(VARIABLE, QUIET_TIMEOUT)
    return blas_pool_quiet()


def blas_pool_quiet() -> bool:
    """Whether the environment asks OpenBLAS's pool to sleep promptly. Read from the
    environment alone, so the answer does not depend on what was imported first; a value set
    after numpy was loaded is believed too (OpenBLAS has no call to read it back)."""
    value = os.environ.get(VARIABLE, "")
    return value.isdigit() and int(value) <= MAX_QUIET
