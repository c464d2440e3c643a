"""The peer in bench/serve.py's report: LiteLLM's proxy (the bench extra pins it) with its local
exact-match cache, one worker and a master key, in front of the same stand-in upstream.

    python3 bench/serve_peer.py --help

Run by bench/serve.py; it is the configuration a LiteLLM user would write for an in-process
cache (``cache: true`` with ``type: local``), nothing tuned. A hit is verified by the header
LiteLLM sets only when it answers from its cache (``x-litellm-cache-key``), as gpucache's are
by ``x-gpucache``. LiteLLM's remote price map is turned off (``LITELLM_LOCAL_MODEL_COST_MAP``):
this machine has no network, and the fetch would only delay the start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MASTER_KEY = "sk-bench"  # the key every wrk request sends (bench/serve.py)
CONFIG = """model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: http://127.0.0.1:{up_port}/v1
      api_key: sk-upstream
litellm_settings:
  cache: true
  cache_params:
    type: local
general_settings:
  master_key: {key}
"""


def executable() -> str | None:
    """LiteLLM's command beside this Python, or on PATH; None where it is not installed."""
    beside = Path(sys.executable).parent / "litellm"
    return str(beside) if beside.is_file() else shutil.which("litellm")


def version() -> str:
    """The version of the LiteLLM that runs: this Python's, or, where LiteLLM lives in an
    environment of its own (its command on PATH), that environment's."""
    import importlib.metadata

    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        command = executable()
        if command is None:
            raise
        environment = Path(command).resolve().parent.parent
        found = sorted(environment.glob("lib/python*/site-packages/litellm-*.dist-info"))
        if not found:
            raise
        return found[-1].name.removeprefix("litellm-").removesuffix(".dist-info")


def command(up_port: int, port: int) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run LiteLLM's proxy on ``port`` in front of the
    upstream on ``up_port``."""
    found = executable()
    if found is None:
        raise RuntimeError("LiteLLM is not installed: pip install -e '.[bench]'")
    config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    with config:
        config.write(CONFIG.format(up_port=up_port, key=MASTER_KEY))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    return [
        found,
        "--config",
        config.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ], env


def health_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/health/liveliness"


def start(up_port: int, port: int) -> subprocess.Popen[bytes]:
    from serve import start as start_server  # bench/serve.py's: waits for the URL to answer

    argv, env = command(up_port, port)
    return start_server(argv, health_url(port), env=env)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    print(executable() or "LiteLLM is not installed")
