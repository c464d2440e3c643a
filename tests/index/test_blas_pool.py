"""Importing gpucache writes nothing to the environment and probes nothing; quieting numpy's
OpenBLAS pool is the application's explicit call (or its environment), and the fp32 engine
follows the environment alone, whatever was imported first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = (
    "import json, os, sys; {first}"
    "import gpucache; {call}"
    "from gpucache.index.probes import CpuPaths; from gpucache.devices import cpu_vendor; "
    "print(json.dumps([os.environ.get('OPENBLAS_THREAD_TIMEOUT'), "
    "CpuPaths.detect().fp32_via_numpy, cpu_vendor() == 'AuthenticAMD', {extra}]))"
)


def probe(first: str = "", call: str = "", timeout: str | None = None, extra: str = "None") -> list:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if timeout is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = timeout
    code = PROBE.format(first=first, call=call, extra=extra)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_import_writes_nothing_and_loads_neither_torch_nor_numpy():
    environment = "sorted(set(os.environ) ^ set(before))"
    code = (
        "import os, sys, json; before = dict(os.environ); import gpucache; "
        f"print(json.dumps([{environment}, 'torch' in sys.modules, 'numpy' in sys.modules]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert json.loads(out) == [[], False, False]


def test_without_the_call_the_pool_spins_and_fp32_stays_in_torch():
    value, via_numpy, _, _ = probe()
    assert (value, via_numpy) == (None, False)


def test_the_call_before_numpy_quiets_the_pool():
    value, via_numpy, amd, quiet = probe(call="quiet = gpucache.quiet_blas_pool(); ", extra="quiet")
    assert (value, quiet) == ("4", True)
    assert via_numpy == amd  # the numpy fp32 engine wherever it pays (AMD CPUs)


def test_the_call_after_numpy_cannot_and_says_so():
    value, via_numpy, _, quiet = probe(
        first="import numpy; ", call="quiet = gpucache.quiet_blas_pool(); ", extra="quiet"
    )
    assert (value, via_numpy, quiet) == (None, False, False)


@pytest.mark.parametrize(("timeout", "quiet"), [("4", True), ("16", True), ("28", False), ("x", False)])
def test_a_value_the_user_chose_is_kept(timeout, quiet):
    value, via_numpy, amd, got = probe(
        call="quiet = gpucache.quiet_blas_pool(); ", timeout=timeout, extra="quiet"
    )
    assert (value, got) == (timeout, quiet)
    assert via_numpy == (amd and quiet)


def test_the_engine_choice_does_not_depend_on_import_order():
    """With the setting in the environment, numpy loaded before gpucache or after gives the
    same engine."""
    assert probe(first="import numpy; ", timeout="4")[:3] == probe(timeout="4")[:3]


def test_the_command_quiets_the_pool_for_itself():
    code = (
        "import sys, os; from gpucache.cli import main; "
        "main(['info']); print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "4"
