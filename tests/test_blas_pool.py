"""gpucache quiets numpy's OpenBLAS thread pool on import, where it still can, and keeps fp32
products in torch where it could not (a spinning pool slowed the next embedding by half)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = (
    "import json, os; {first}"
    "import gpucache.blas_pool as b, gpucache.store as s, gpucache.devices as d; "
    "print(json.dumps([os.environ.get('OPENBLAS_THREAD_TIMEOUT'), b.BLAS_POOL_QUIET, "
    "s.FP32_MATMUL_VIA_NUMPY, d.cpu_vendor() == 'AuthenticAMD']))"
)


def probe(first: str = "", timeout: str | None = None) -> tuple[str | None, bool, bool, bool]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if timeout is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = timeout
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    value, quiet, via_numpy, amd = json.loads(out.strip().splitlines()[-1])
    return value, quiet, via_numpy, amd


def test_imported_first_it_sets_the_quiet_timeout():
    value, quiet, via_numpy, amd = probe()
    assert (value, quiet) == ("4", True)
    assert via_numpy == amd  # the numpy fp32 path wherever it pays (AMD CPUs)


def test_after_numpy_it_cannot_and_keeps_fp32_products_in_torch():
    value, quiet, via_numpy, _ = probe(first="import numpy; ")
    assert (value, quiet, via_numpy) == (None, False, False)


@pytest.mark.parametrize(("timeout", "quiet"), [("4", True), ("16", True), ("28", False), ("x", False)])
def test_a_value_the_user_chose_is_kept(timeout, quiet):
    value, got_quiet, via_numpy, amd = probe(timeout=timeout)
    assert (value, got_quiet) == (timeout, quiet)
    assert via_numpy == (amd and quiet)


def test_numpy_loaded_after_a_user_setting_counts_as_quiet():
    assert probe(first="import numpy; ", timeout="4")[:2] == ("4", True)
