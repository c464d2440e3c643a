"""Start the real vLLM engine that scripts/install_vllm.sh installed, on a free loopback port.

    python3 scripts/vllm_upstream.py [--port N]    # prints the base URL, serves until Ctrl-C

then ``gpucache serve --upstream http://127.0.0.1:N/v1`` (with ``--api-key KEY`` here: vLLM then
refuses every other key, so the proxy's default ``--auth upstream`` can ask it; without one, vLLM
checks no keys and the proxy needs ``--auth none``). The tests (tests/serve/test_vllm.py)
and bench/serve_vllm.py start it through :class:`Engine`.

Why these flags: ``--enforce-eager`` skips the torch.compile warm-up (start in about 40 s on a
2-core CPU instead of about 100 s, for a 135M model whose decode the compile barely changes);
``--dtype float32`` because the CPU build of this engine is exact in fp32 and the tests compare
streams token by token; ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) because the default reserves more
memory than a 2,048-token model needs. vLLM binds its compute threads to one core and leaves
the other (its ``VLLM_CPU_OMP_THREADS_BIND=auto``), which is the core the proxy answers on.

Readiness is an event: the engine's log line ``Application startup complete`` (or its exit)
ends the wait; then the port is connected to (uvicorn listens a moment after that line) and
``/v1/models`` asked once.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("GPUCACHE_VLLM_VENV", ROOT / ".venv-vllm"))
MODEL = Path(os.environ.get("GPUCACHE_VLLM_MODEL", ROOT / ".vllm-model" / "smollm2"))
SERVED_NAME = "smollm2"
MAX_MODEL_LEN = 2048
READY_LINE = "Application startup complete"
START_TIMEOUT_S = 600.0


def missing() -> str | None:
    """Why the engine cannot start here, or None when it can."""
    if not (VENV / "bin" / "python").is_file():
        return f"no vLLM environment at {VENV}: run `bash scripts/install.sh vllm`"
    if not (MODEL / "model.safetensors").is_file():
        return f"no converted model at {MODEL}: run `bash scripts/install.sh vllm`"
    return None


def versions() -> dict[str, str]:
    """The engine's and its libraries' versions, as its environment reports them."""
    code = (
        "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
        "('vllm-cpu', 'torch', 'transformers')}))"
    )
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Engine:
    """One vLLM OpenAI-compatible server process (and the engine-core process it spawns, in
    its own process group so that :meth:`kill` takes both). ``url`` is the ``/v1`` base."""

    def __init__(
        self,
        port: int | None = None,
        max_model_len: int = MAX_MODEL_LEN,
        api_key: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        why = missing()
        if why is not None:
            raise RuntimeError(why)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.max_model_len = max_model_len
        self.api_key = api_key  # vLLM then refuses any other bearer token (401)
        self.extra = extra  # more of vLLM's own flags
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._ready = threading.Event()
        self._process: subprocess.Popen[str] | None = None

    def command(self) -> list[str]:
        return [
            str(VENV / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(MODEL),
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--disable-uvicorn-access-log",
            *(["--api-key", self.api_key] if self.api_key else []),
            *self.extra,
        ]

    def start(self) -> Engine:
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        env.pop("PYTHONPATH", None)  # the engine's environment is its own
        # run from its environment's folder: nothing of the checkout is imported in its place
        self._process = subprocess.Popen(
            self.command(),
            env=env,
            cwd=VENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, args=(self._process,), daemon=True).start()
        if not self._ready.wait(START_TIMEOUT_S) or self._process.poll() is not None:
            self.stop()
            raise RuntimeError("vLLM did not start:\n" + "\n".join(self.log))
        self._await_listening()
        credentials = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        asked = urllib.request.Request(f"{self.url}/models", headers=credentials)
        try:
            with urllib.request.urlopen(asked, timeout=30) as reply:
                models = json.load(reply)
        except OSError as exc:
            self.stop()
            tail = "\n".join(self.log)
            raise RuntimeError(f"vLLM started but {self.url}/models failed: {exc}\n{tail}") from exc
        if [m["id"] for m in models["data"]] != [SERVED_NAME]:
            self.stop()
            raise RuntimeError(f"vLLM serves {models}")
        return self

    def _await_listening(self, within_s: float = 30.0) -> None:
        """vLLM binds its socket early but uvicorn listens on it only after the start-up line,
        so a connection in between is refused: try to connect until one is accepted."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
                return
            except OSError:
                if time.monotonic() > deadline or not self.running:
                    return  # the request below reports it, with the log
                time.sleep(0.02)

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.log.append(line.rstrip())
            if READY_LINE in line:
                self._ready.set()
        self._ready.set()  # it exited: the waiter sees poll() and the log

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """Stop it at once, as a crash would (SIGKILL to the whole group)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=None, help="loopback port (default: a free one)")
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    parser.add_argument("--api-key", default=None, help="the one key vLLM accepts (default: any)")
    args = parser.parse_args(argv)
    why = missing()
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    with Engine(args.port, args.max_model_len, args.api_key) as engine:
        print(engine.url, flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(main())
