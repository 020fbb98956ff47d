"""Almost nothing before authentication, under a flood: 600 connections at once, each
sending the first half of a 1 MiB frame and then nothing, and a second after each is
closed another in its place, for 10 s, while two real consumers process keyed records.
(A flood of connections as such, and the admission limits against it, are test_flood's.)

Buffered, those half frames would hold about 300 MiB in the coordinator, and 600 whole
ones more than the Helm chart's memory limit. Each is refused at its 4-byte header
instead (the frame limit before Register, 64 KiB), so the coordinator's memory stays
within the chart's limit (read from helm/keyshard/values.yaml), the consumers keep their
rate, and nothing is lost or reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
import time
from pathlib import Path

import pytest
import yaml

from harness import CoordinatorProcess, Workers, create_topic, produce, rss_mib, wait_for
from keyshard.core.protocol.codec import PROTOCOL_VERSION
from keyshard.local.broker import EmbeddedBroker
from keyshard.local.verify import Produced, check
from tests.deploy.chart import CHART

pytestmark = [pytest.mark.integration, pytest.mark.brokers("tansu")]

FLOOD = 600  # connections at once
FRAME = 1 << 20  # the frame each one announces
FLOOD_S = 10.0
REOPEN_S = 1.0  # how long each of the 600 waits, after its connection closed, to open the next
RATE, RECORDS, KEYS = 300.0, 9000, 300  # 30 s of keyed traffic


def chart_memory_limit_mib() -> float:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    limit = str(values["resources"]["limits"]["memory"])
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(limit[:-2]) * units[limit[-2:]]


async def _half_frame(port: int, deadline: float) -> int:
    """Connections, one after another until `deadline`, each announcing a 1 MiB frame and
    sending half of it, then waiting for the coordinator to close it (and REOPEN_S more).
    Returns how many."""
    loop = asyncio.get_running_loop()
    half = struct.pack(">I", FRAME) + bytes((PROTOCOL_VERSION,)) + b"{" + b" " * (FRAME // 2)
    sent = 0
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            sent += 1
            with contextlib.suppress(OSError):  # refused at the header: the rest bounces
                await asyncio.wait_for(loop.sock_sendall(sock, half), 15)
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(15):
                    while await loop.sock_recv(sock, 65536):
                        pass
        except OSError:
            pass  # a refused or reset connect: try again
        finally:
            sock.close()
        await asyncio.sleep(REOPEN_S)
    return sent


async def test_half_sent_frames_neither_fill_memory_nor_slow_consumers(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = FLOOD + 512
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the flood needs {needed} open files here; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    limit_mib = chart_memory_limit_mib()
    coordinator = CoordinatorProcess(
        broker.bootstrap_servers, tmp_path, extra=["--drain-timeout-ms", "2000"]
    )
    workers = Workers(coordinator, tmp_path)
    traffic: asyncio.Task[list[Produced]] | None = None
    try:
        await create_topic(broker.bootstrap_servers)
        await coordinator.start()
        for name in ("c0", "c1"):
            workers.spawn(name)
        await wait_for(lambda: coordinator.settled(2), 30, "two members settled")
        traffic = asyncio.create_task(produce(broker.bootstrap_servers, RECORDS, KEYS, rate=RATE))
        await wait_for(lambda: workers.unique() >= 300, 30, "processing under way")

        began, before = time.monotonic(), workers.unique()
        await asyncio.sleep(3.0)  # the rate before the flood, over a window
        rate_before = (workers.unique() - before) / (time.monotonic() - began)
        baseline_mib = rss_mib(coordinator.pid)

        peak_mib = baseline_mib
        flooding = time.monotonic()
        deadline = flooding + FLOOD_S
        flood = asyncio.gather(
            *(_half_frame(coordinator.listen_port, deadline) for _ in range(FLOOD))
        )
        during = workers.unique()
        while not flood.done():
            peak_mib = max(peak_mib, rss_mib(coordinator.pid))
            await asyncio.sleep(0.1)
        connections = sum(await flood)
        flood_s = time.monotonic() - flooding
        rate_during = (workers.unique() - during) / flood_s

        produced = await asyncio.wait_for(traffic, 60)
        await wait_for(lambda: workers.unique() >= len(produced), 60, "every record processed")
        report = check(produced, workers.processed())
    finally:
        if traffic is not None and not traffic.done():
            traffic.cancel()
            await asyncio.gather(traffic, return_exceptions=True)
        workers.stop_all()
        coordinator.stop()
    print(
        f"\n{connections} connections with half a 1 MiB frame in {flood_s:.1f} s; coordinator "
        f"RSS {baseline_mib:.0f} MiB before, {peak_mib:.0f} MiB at most (chart limit "
        f"{limit_mib:.0f} MiB); processed {rate_before:.0f}/s before, {rate_during:.0f}/s "
        f"during (produced at {RATE:.0f}/s)"
    )
    assert connections >= FLOOD  # every one of the 600 got through at least once
    assert peak_mib < limit_mib
    assert peak_mib - baseline_mib < 100  # no half frame was kept
    assert rate_during >= 0.5 * min(rate_before, RATE), (rate_before, rate_during)
    assert report.ok, report
    log = coordinator.read_log()
    assert "Traceback" not in log
    assert log.count("bad input from") <= 5 * (1 + int(flood_s / 10) + 1)  # throttled
