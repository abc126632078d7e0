"""One worker child process (`python -m wpk.search.worker_main`) seen from the parent.

`WorkerProcess.request(message, timeout_s) -> reply` sends one JSON request and
waits for its reply; a child that does not answer in time is killed
(`WorkerTimeout`), one that dies is reaped and described (`WorkerCrash`: the
signal's name, or the exit code, and the tail of its stderr). The next request
starts a fresh child. `send` / `reply_ready` / `read_reply` are the same steps
taken apart, for pools that wait on several children with `select`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from wpk.core.devices import restricted_cpu_flags

STARTUP_TIMEOUT_S = 120.0
STDERR_TAIL_CHARS = 2000


# argv of a child: '--cpu-flags=avx2,fma,...' (the parent's `restrict_cpu_flags`).
CPU_FLAGS_OPTION = "--cpu-flags="


class WorkerTimeout(Exception):
    """The worker did not answer in time (it has been killed)."""


class WorkerCrash(Exception):
    """The worker died while serving a request (`reason` says how)."""

    def __init__(self, reason: str, stderr_tail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.stderr_tail = stderr_tail


class WorkerProcess:
    """One `python -m wpk.search.worker_main` child: started lazily, killed on failure.

    `request(message, timeout_s)` returns the reply dict or raises
    `WorkerTimeout` / `WorkerCrash`; after either the next request starts a
    fresh process. `starts` counts the processes started. `env` is the child's
    environment (default: this process's at the time the child starts).
    """

    def __init__(self, preload: Sequence[str] = (), env: Mapping[str, str] | None = None):
        self.preload = tuple(preload)
        self.env = None if env is None else dict(env)
        self.starts = 0
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._stderr = None
        self._ready = False
        self._awaiting = 0   # replies owed (startup line, requests sent)
        self.deadline = 0.0

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.alive else None

    @property
    def fileno(self) -> int:
        return self._proc.stdout.fileno()

    def start(self) -> None:
        """Start the child (if it is not running) and wait for it to be ready."""
        if not self.alive:
            self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start a fresh child without waiting for it (`wait_ready` finishes the start)."""
        self.kill()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (lives as long as the child)
        restricted = restricted_cpu_flags()  # the child sees the CPU as this process does
        isa = [] if restricted is None else [CPU_FLAGS_OPTION + ",".join(restricted)]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "wpk.search.worker_main", *isa, *self.preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            env=self.env, start_new_session=True)
        self._buffer = b""
        self._ready = False
        self._awaiting = 1
        self.starts += 1
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S

    def wait_ready(self) -> None:
        """Wait for a launched child's ready line and hand it this process's import path."""
        if self._ready:
            return
        try:
            self.read_reply()
            self.send({"kind": "init", "sys_path": list(sys.path)}, STARTUP_TIMEOUT_S)
            self.read_reply()
        except WorkerCrash as crash:
            raise WorkerCrash(f"{crash.reason} while starting", crash.stderr_tail) from None
        self._ready = True

    def request(self, message: Mapping, timeout_s: float) -> dict:
        """Send one request and wait up to `timeout_s` for its reply."""
        self.start()
        self.send(message, timeout_s)
        return self.read_reply()

    def send(self, message: Mapping, timeout_s: float) -> None:
        """Write one request; its reply is due within `timeout_s`."""
        os.lseek(self._stderr.fileno(), 0, os.SEEK_SET)
        os.ftruncate(self._stderr.fileno(), 0)
        self.deadline = time.monotonic() + timeout_s
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
            self._awaiting += 1
        except (BrokenPipeError, OSError):
            raise self._crashed() from None

    def reply_ready(self) -> bool:
        """True when a whole reply line (or EOF) is there to read without blocking."""
        if b"\n" in self._buffer:
            return True
        readable, _, _ = select.select([self.fileno], [], [], 0)
        if not readable:
            return False
        chunk = os.read(self.fileno, 1 << 16)
        if not chunk:
            return True
        self._buffer += chunk
        return b"\n" in self._buffer or self.reply_ready()

    def read_reply(self) -> dict:
        """The next reply, waiting until the deadline (then the child is killed)."""
        while b"\n" not in self._buffer:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerTimeout("no reply before the deadline")
            readable, _, _ = select.select([self.fileno], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(self.fileno, 1 << 16)
            if not chunk:
                raise self._crashed()
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        self._awaiting -= 1
        return json.loads(line)

    def _crashed(self) -> WorkerCrash:
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        tail = self._stderr_tail()
        self.kill()
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            reason = f"worker killed by {name} ({signal.strsignal(-code)})"
        elif code is not None:
            reason = f"worker exited with code {code}"
        else:
            reason = "worker closed its output and did not exit"
        return WorkerCrash(reason, tail)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace")[-STDERR_TAIL_CHARS:]
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        """Kill the child now (SIGKILL) and reap it."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self._buffer = b""
        self._ready = False
        self._awaiting = 0

    def close(self) -> None:
        """End the child: EOF on its stdin, then SIGKILL if it lingers; at once when it is
        still busy with a request (a build interrupted mid-measurement)."""
        if self.alive and self._awaiting == 0:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
