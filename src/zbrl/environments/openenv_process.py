"""The OpenEnv server process of a producer (or the evaluator): started on 127.0.0.1 with a free
port, waited for until it answers, stopped by its pid.

The server is :mod:`zbrl.environments.openenv_serve` in a child process. It reports its port on
its first stdout line, then answers ``GET /health``; zbrl waits for both within
``start_timeout_s``. A server that exits or does not answer in time is a RunError naming
``environment.server`` with the tail of its stderr. It is stopped by :meth:`OpenEnvServer.stop`
(SIGTERM, then SIGKILL), at the latest when its parent exits (``atexit``), and it ends itself
when its parent is gone (a killed producer leaves no server behind).
"""

from __future__ import annotations

import atexit
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from zbrl.environments.openenv_serve import BAD_SERVER, PORT_LINE
from zbrl.errors import RunError

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Loopback is asked directly, whatever proxy the environment names."""

STDERR_TAIL_CHARS = 2000
"""How much of a failed server's stderr its error shows."""


class OpenEnvServer:
    """One OpenEnv environment server (a child process), from :meth:`start` to :meth:`stop`."""

    def __init__(self, server: str, max_sessions: int, start_timeout_s: float) -> None:
        self.server = server
        self.max_sessions = max_sessions
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        """``http://127.0.0.1:<port>`` once started."""
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the server)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> str:
        """Start the server and wait until it answers; its base URL."""
        env = dict(os.environ)
        # the child imports what this process imports (a Ray worker's path, the working dir)
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, os.getcwd()]))
        argv = [sys.executable, "-m", "zbrl.environments.openenv_serve", self.server]
        argv += [str(self.max_sessions), str(os.getpid())]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._stderr, stdin=subprocess.DEVNULL, env=env
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            port = self._read_port(deadline)
            self.url = f"http://127.0.0.1:{port}"
            self._wait_healthy(deadline)
        except RunError:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 5 s) and reap it; idempotent."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        except ProcessLookupError:
            pass

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-STDERR_TAIL_CHARS:].strip()

    def _failed(self, why: str) -> RunError:
        tail = self.stderr_tail() or "(nothing on stderr)"
        return RunError(
            f"environment.server: the OpenEnv server for {self.server} {why}; its stderr "
            f"ends with:\n{tail}"
        )

    def _read_port(self, deadline: float) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            line = b""
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._failed(f"did not start within {self.start_timeout_s:g} s")
                if not sel.select(timeout=min(left, 0.5)):
                    if self.proc.poll() is not None:
                        break
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 256)
                if not chunk:
                    break
                line += chunk
        word, _, port = line.decode(errors="replace").strip().partition(" ")
        if word != PORT_LINE or not port.isdigit():
            code = self.proc.wait(timeout=5)
            why = "cannot serve it" if code == BAD_SERVER else f"exited (status {code})"
            raise self._failed(why)
        return int(port)

    def _wait_healthy(self, deadline: float) -> None:
        assert self.proc is not None
        while True:
            try:
                with NO_PROXY.open(f"{self.url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise self._failed(f"exited (status {self.proc.returncode})")
            if time.monotonic() > deadline:
                raise self._failed(f"did not answer within {self.start_timeout_s:g} s")
            time.sleep(0.1)
