"""Keep numpy's OpenBLAS worker threads from spinning on the cores torch needs.

Why: on AMD CPUs the fp32 scan multiplies through numpy's OpenBLAS (``FP32_MATMUL_VIA_NUMPY``
in ``store.py``) while the embedder runs in torch, one after the other on the same cores.
OpenBLAS's worker threads busy-wait for about 2^28 cycles (a tenth of a second) after every
product before they sleep, and in that time they take the cores from torch's threads: on this
project's 2-core AMD EPYC, embedding 64 prompts right after a scan took 140 ms instead of 86,
and ``get_or_put_all`` end to end ran at 401 prompts/s instead of 905.

``OPENBLAS_THREAD_TIMEOUT=4`` (2^4 cycles) puts them to sleep at once. OpenBLAS reads it when
it is loaded, that is when numpy is first imported (torch imports numpy), so gpucache sets it
as its very first import, where numpy is not loaded yet and the user has not chosen a value.
Where numpy was loaded first without it, the pool spins; then ``BLAS_POOL_QUIET`` is False and
the store keeps its fp32 products in torch, which never hands the cores to a spinning pool.

This module imports neither numpy nor torch: it must run before them.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "OPENBLAS_THREAD_TIMEOUT"
QUIET_TIMEOUT = "4"  # OpenBLAS's minimum: 2^4 cycles of spinning before a worker sleeps
MAX_QUIET = 16  # 2^16 cycles, about 20 microseconds: still quiet


def _quiet_pool() -> bool:
    """Set the quiet timeout if numpy is not loaded yet and none is set; whether OpenBLAS's
    pool in this process sleeps promptly (as far as can be known from here)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault(VARIABLE, QUIET_TIMEOUT)
    value = os.environ.get(VARIABLE, "")
    return value.isdigit() and int(value) <= MAX_QUIET


BLAS_POOL_QUIET = _quiet_pool()
