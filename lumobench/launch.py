"""Launching an arm: own process group, log file, readiness wait, whole-group shutdown.

A launched arm never outlives lumobench: a watchdog process (`lumobench.watchdog`) stops its whole
process group when lumobench dies without stopping it (kill -9). Its log never holds a secret: the
command line lumobench writes there is masked, and when the arm has secrets its output passes through
a thread that masks them on the way to the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from lumobench.arms import ResolvedArm
from lumobench.errors import LumobenchError
from lumobench.probe import EndpointInfo, ProbeError, auth_headers, call_sync, model_cards, probe_endpoint
from lumobench.redact import Redactor

STOP_GRACE_S = 15.0
#: how often a launched arm's watchdog is checked (a killed one is started again)
WATCHDOG_CHECK_S = 0.2
#: the arm's first program: asks the kernel for SIGTERM when lumobench dies (PR_SET_PDEATHSIG, kept
#: across exec), then becomes the arm's command. Should the watchdog be gone too (killed), the arm
#: still learns of lumobench's death. A parent that died before the request makes it exit at once.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "try: os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as exc: sys.exit(f'lumobench: cannot start {sys.argv[2]}: {exc.strerror}')\n"
)
#: the deadline of one readiness probe (the readiness timeout bounds them all)
READY_PROBE_S = 5.0


class ArmStartError(LumobenchError):
    """The arm exited or did not become ready; the message ends with the tail of its log."""


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on (host, port) or the address cannot be bound."""
    if not 0 < port < 65536:
        raise LumobenchError(f"port {port} is not a TCP port (1-65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Refuse, as a user mistake, a port something already listens on."""
    if port_in_use(host, port):
        raise LumobenchError(
            f"port {port} on {host} is already in use (another server running?); "
            f"stop it or pick another port with --port"
        )


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _copy_masked(pipe: IO[bytes], log: IO[bytes], redactor: Redactor) -> None:
    """Copy the arm's output to its log line by line, secrets masked (a thread, until end of output)."""
    with contextlib.suppress(ValueError, OSError):  # the log closed under us at shutdown
        for line in iter(pipe.readline, b""):
            log.write(redactor.raw(line))
            log.flush()


class ArmServer:
    """One running arm process (and its children, all in one process group)."""

    def __init__(self, arm: ResolvedArm, log_path: Path) -> None:
        self.arm = arm
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.served_model: str | None = None  # first id listed by the models endpoint once ready
        self.redactor = Redactor.for_arm(arm)
        self._log: IO[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._keeper: threading.Thread | None = None
        self._stopping = threading.Event()
        self._copier: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return self.arm.base_url

    def start(self) -> None:
        """Launch the arm in its own process group with a watchdog (call it from a thread that lives as
        long as the arm, the main thread: the kernel's parent-death signal follows the launching thread)."""
        check_port_free(self.arm.config.host, self.arm.port)
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
        except OSError as exc:
            raise LumobenchError(f"cannot write the server log {self.log_path}: {exc.strerror}") from None
        command = " ".join(self.redactor.argv(self.arm.argv))
        self._log.write(f"\n=== lumobench: starting arm {self.arm.name}: {command}\n".encode())
        self._log.flush()
        masked = self.redactor.masks_text
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _DIE_WITH_PARENT, str(os.getpid()), *self.arm.argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if masked else self._log,
                stderr=subprocess.STDOUT,
                env=os.environ | self.arm.env,
                start_new_session=True,  # own process group: one killpg stops the engine's workers too
            )
        except OSError as exc:
            self._log.close()
            raise LumobenchError(
                f"arm {self.arm.name}: cannot start {self.arm.argv[0]}: {exc.strerror}"
            ) from None
        self._watchdog = self._new_watchdog()
        self._keeper = threading.Thread(target=self._keep_watchdog, name="watchdog-keeper", daemon=True)
        self._keeper.start()
        if masked:
            assert self.proc.stdout is not None
            self._copier = threading.Thread(
                target=_copy_masked, args=(self.proc.stdout, self._log, self.redactor), daemon=True
            )
            self._copier.start()

    def _new_watchdog(self) -> subprocess.Popen[bytes]:
        assert self.proc is not None
        return subprocess.Popen(
            [sys.executable, "-m", "lumobench.watchdog", str(self.proc.pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _keep_watchdog(self) -> None:
        """Start the watchdog again whenever it died (killed by someone) while the arm runs."""
        while not self._stopping.wait(WATCHDOG_CHECK_S):
            dead = self._watchdog
            if dead is not None and dead.poll() is not None and self.exit_code() is None:
                with contextlib.suppress(OSError):
                    assert dead.stdin is not None
                    dead.stdin.close()
                self._watchdog = self._new_watchdog()

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def _fail(self, why: str) -> ArmStartError:
        tail = log_tail(self.log_path)
        return ArmStartError(f"arm {self.arm.name} {why}; last lines of {self.log_path}:\n{tail}")

    def _key_hint(self) -> str:
        if self.arm.api_key_env:
            return f"the API key in {self.arm.api_key_env} is not the one the server expects"
        return "the server requires an API key: set api_key_env in the arm file or pass --api-key-env NAME"

    def wait_ready(self, timeout_s: float | None = None, on_wait: Callable[[str], None] | None = None) -> str:
        """Block until health answers 200 and the models endpoint lists a model; return the model id.

        Raises `ArmStartError` (with the log tail) if the process exits or the timeout passes.
        """
        ready = self.arm.config.readiness
        limit_s = timeout_s or ready.timeout_s
        deadline = time.monotonic() + limit_s
        stage = "health"
        while True:
            if on_wait:
                on_wait(stage)
            if (code := self.exit_code()) is not None:
                raise self._fail(f"exited with code {code} before it was ready")
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"was not ready after {limit_s:.0f} s (waiting for {stage})")
            path = ready.health if stage == "health" else ready.models
            try:
                answer = call_sync(
                    "GET", self.base_url + path, min(READY_PROBE_S, left), auth_headers(self.arm.api_key)
                )
            except ProbeError:
                answer = None  # not listening yet, or a half-started server
            if answer is not None and answer.status in (401, 403):  # a key will not appear by waiting
                raise self._fail(
                    f"refused the readiness probe {path} with HTTP {answer.status}: {self._key_hint()}"
                )
            if answer is not None and answer.status == 200:
                if stage == "health":
                    stage = "models"
                    continue
                if cards := model_cards(answer):
                    model: str = cards[0]["id"]
                    self.served_model = model
                    return model
            time.sleep(0.5)

    def stop(self) -> int | None:
        """SIGTERM the whole process group, SIGKILL it after a grace period; return the exit code."""
        if self.proc is None:
            return None
        try:
            if self.proc.poll() is None:
                _signal_group(self.proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(STOP_GRACE_S)
            # children may outlive the leader: always sweep the group
            _signal_group(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()
        finally:
            self._disarm_watchdog()
            if self._copier:
                self._copier.join(timeout=5)
                self._copier = None
                if self.proc.stdout:
                    self.proc.stdout.close()
            if self._log:
                self._log.write(f"=== lumobench: arm {self.arm.name} stopped\n".encode())
                self._log.close()
                self._log = None

    def _disarm_watchdog(self) -> None:
        self._stopping.set()
        if self._keeper is not None:
            self._keeper.join()
            self._keeper = None
        if self._watchdog is None:
            return
        with contextlib.suppress(OSError):
            assert self._watchdog.stdin is not None
            self._watchdog.stdin.write(b"x")
            self._watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._watchdog.wait(5)
        self._watchdog = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def start_arm(
    arm: ResolvedArm, log_path: Path, on_wait: Callable[[str], None] | None = None
) -> tuple[ArmServer, EndpointInfo]:
    """Launch the arm, wait until it is ready and ask it what it serves and runs (`probe_endpoint`); an
    arm that fails any of that is stopped again before the error propagates."""
    server = ArmServer(arm, log_path)
    server.start()
    try:
        server.wait_ready(on_wait=on_wait)
        return server, probe_endpoint(arm.base_url, arm.api_key)
    except BaseException:
        server.stop()
        raise


@contextmanager
def launched(
    arm: ResolvedArm, log_path: Path, on_wait: Callable[[str], None] | None = None
) -> Iterator[ArmServer]:
    """`start_arm`, yield the server, and stop its whole group on any exit (Ctrl-C too)."""
    server, _ = start_arm(arm, log_path, on_wait)
    try:
        yield server
    finally:
        server.stop()
