"""`/healthz`, `/readyz` and `/metrics` of a consumer process, for its pod's probes.

The server runs in a thread of its own (the standard library's `ThreadingHTTPServer`: a
consumer-only install has no web framework), so a stalled event loop — a handler that
blocks it, say — is reported as such instead of making the probe time out with no
reason. The loop proves it is alive by taking a `ConsumerSnapshot` every
`SNAPSHOT_INTERVAL_S`; the HTTP thread answers from the last one only.

- `/healthz`: 200 while the loop has taken a snapshot within `STALL_AFTER_S`; 503 naming
  how long it has been stalled (a liveness probe restarts the pod).
- `/readyz`: 200 while registered and a coordinator spoke within the session timeout (a
  consumer rides through a coordinator failover while its lease lasts, so a failover
  alone does not make it unready); 503 with the reason otherwise, and from the first
  SIGTERM on (it is leaving), and while it cannot read Kafka (past its fetch failure
  timeout it hands its ranges back until Kafka answers again, docs/protocol.md §7.6).
- `/metrics`: `_operations.metrics`, Prometheus text format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from keyshard.consumer_client._operations.metrics import ConsumerMetrics, ConsumerSnapshot
from keyshard.core.model.addresses import parse_host_port

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_S = 1.0
#: The loop has not taken a snapshot for this long: /healthz says it is stalled.
STALL_AFTER_S = 10.0


class ConsumerEndpoints:
    """Serves one consumer's endpoints while `run()` runs (`CoordinatedConsumer` starts
    and stops it when given `metrics_listen`). `snapshot` is called on the event loop."""

    def __init__(
        self,
        metrics: ConsumerMetrics,
        snapshot: Callable[[], ConsumerSnapshot],
        session_timeout_ms: int,
        listen: str,
    ) -> None:
        try:
            self.host, self.port = parse_host_port(listen)
        except ValueError as err:
            raise ValueError(f"metrics_listen {err}") from None
        self.metrics = metrics
        self._snapshot = snapshot
        self.session_timeout_s = session_timeout_ms / 1000
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    async def start(self) -> None:
        """Bind (an OSError for a busy port, here) and serve; snapshot once a second."""
        self.metrics.snapshot = self._snapshot()
        endpoints = self

        class Handler(_Handler):
            owner = endpoints

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="keyshard-endpoints", daemon=True
        )
        self._thread.start()
        self._task = asyncio.create_task(self._take_snapshots(), name="keyshard-snapshots")
        log.info("consumer endpoints on http://%s (/healthz, /readyz, /metrics)", self.address)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.shutdown)
            server.server_close()

    async def _take_snapshots(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
            self.metrics.snapshot = self._snapshot()

    # ---- answers (HTTP thread) --------------------------------------------------------

    def health(self) -> tuple[int, str]:
        snap = self.metrics.snapshot
        if snap is None:
            return 503, "not started"
        stalled = time.monotonic() - snap.taken
        if stalled > STALL_AFTER_S:
            return 503, f"event loop stalled for {stalled:.1f} s"
        return 200, "ok"

    def readiness(self) -> tuple[int, str]:
        snap = self.metrics.snapshot
        code, reason = self.health()
        if snap is None or code != 200:
            return 503, reason
        if snap.closing:
            return 503, "closing"
        if snap.unreadable_for is not None:
            return 503, f"cannot read Kafka for {snap.unreadable_for:.1f} s"
        if not snap.registered or snap.heard_ago is None:
            return 503, "not registered with a coordinator"
        heard_ago = snap.heard_ago + (time.monotonic() - snap.taken)
        if heard_ago > self.session_timeout_s:
            return 503, f"no coordinator heard from for {heard_ago:.1f} s"
        return 200, "ready"


class _Handler(BaseHTTPRequestHandler):
    owner: ConsumerEndpoints

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.owner.metrics.registry), CONTENT_TYPE_LATEST)
            return
        if path == "/healthz":
            code, text = self.owner.health()
        elif path == "/readyz":
            code, text = self.owner.readiness()
        else:
            code, text = 404, "not found: /healthz, /readyz and /metrics are served"
        self._send(code, (text + "\n").encode(), "text/plain; charset=utf-8")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Probes every few seconds would flood stderr: requests are not logged."""
