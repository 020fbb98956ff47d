"""A connection flood as a new user can set it off: a coordinator at the common open-file
limit of 1,024, and 1,100 TCP connections to its consumer port that send nothing (or half
a length prefix) and stay open.

Left open, such connections would leave nobody able to connect (a real client's Metadata
request times out) and grow the log by 60 MB of `socket.accept() out of system resource`
tracebacks in 6 s. While three consumers process keyed traffic: they keep processing, a
client asking Metadata meanwhile gets an answer (or a clear refusal) at once, every flood
connection is closed by the registration deadline or refused with the reason, a fourth
consumer joins and gets ranges, nothing is lost or reordered, and the log stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import (
    CoordinatorProcess,
    Workers,
    create_topic,
    produce,
    wait_for,
)
from keyshard.coordinator.server.admission import DEFAULT_REGISTER_TIMEOUT_MS
from keyshard.core.protocol.codec import FrameDecoder, ProtocolError, encode
from keyshard.core.protocol.messages import ErrorCode, ErrorResponse, MetadataRequest
from keyshard.local.broker import EmbeddedBroker
from keyshard.local.verify import Produced, check

pytestmark = pytest.mark.integration

OPEN_FILES = 1024  # soft and hard: raising soft to hard at start changes nothing
FLOOD = 1100
RECORDS, KEYS, RATE = 9000, 300, 300.0  # keyed traffic for the whole test (30 s)
DEADLINE_S = DEFAULT_REGISTER_TIMEOUT_MS / 1000  # the default a new user gets


def _open_file_limit() -> None:
    """In the coordinator's child process, before exec."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


@contextlib.contextmanager
def _own_open_file_limit(needed: int) -> Iterator[None]:
    """Enough descriptors in this test process for the flood's client ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the flood needs {needed} open files here; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield None
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _connect(port: int, half_prefix: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    if half_prefix:
        sock.send(b"\x00\x00")  # two of the four bytes of a length, then nothing
    return sock


async def _until_closed(sock: socket.socket, timeout: float) -> tuple[str, float]:
    """Read until the coordinator closes; the error code it gave (or why none), and when."""
    loop = asyncio.get_running_loop()
    data = b""
    try:
        async with asyncio.timeout(timeout):
            while chunk := await loop.sock_recv(sock, 4096):
                data += chunk
    except TimeoutError:
        return "still open", time.monotonic()
    except ConnectionError:
        pass
    closed = time.monotonic()
    try:
        messages = FrameDecoder().feed(data)
    except ProtocolError:
        return "garbled", closed
    errors = [m.code for m in messages if isinstance(m, ErrorResponse)]
    return (str(errors[-1]) if errors else "closed without a word"), closed


async def _metadata_answer(port: int) -> str:
    """What a fresh client asking Metadata gets, within 2 s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(encode(MetadataRequest(correlation_id=1)))
        async with asyncio.timeout(2):
            head = await reader.readexactly(4)
            body = await reader.readexactly(int.from_bytes(head, "big"))
        (message,) = FrameDecoder().feed(head + body)
        return message.code if isinstance(message, ErrorResponse) else message.type
    finally:
        writer.close()


async def test_a_connection_flood_neither_stops_consumers_nor_floods_the_log(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    began = time.monotonic()
    coordinator = CoordinatorProcess(
        broker.bootstrap_servers,
        tmp_path,
        extra=["--drain-timeout-ms", "2000"],
        preexec_fn=_open_file_limit,
    )
    workers = Workers(coordinator, tmp_path)
    flood: list[socket.socket] = []
    traffic: asyncio.Task[list[Produced]] | None = None
    with _own_open_file_limit(FLOOD + 512):
        try:
            await create_topic(broker.bootstrap_servers)
            await coordinator.start()
            for i in range(3):
                workers.spawn(f"worker-{i}")
            await wait_for(lambda: coordinator.settled(3), 30, "three members settled")
            traffic = asyncio.create_task(
                produce(broker.bootstrap_servers, RECORDS, KEYS, rate=RATE)
            )
            await wait_for(lambda: workers.unique() >= 300, 20, "processing under way")

            # The flood: idle connections, every third with half a length prefix.
            flooded = time.monotonic()
            for start in range(0, FLOOD, 100):
                flood += await asyncio.gather(
                    *(
                        _connect(coordinator.listen_port, i % 3 == 0)
                        for i in range(start, start + 100)
                    )
                )
            opened_s = time.monotonic() - flooded
            endings = [asyncio.create_task(_until_closed(s, DEADLINE_S + 10)) for s in flood]

            # Meanwhile: a real client is answered at once, and the members keep going.
            assert await _metadata_answer(coordinator.listen_port) in {
                "metadata_response",
                ErrorCode.TOO_MANY_CONNECTIONS,
            }
            during = workers.unique()
            await wait_for(lambda: workers.unique() >= during + 600, 10, "progress in the flood")
            workers.spawn("worker-3")  # joins once the deadline frees the slots

            outcomes = await asyncio.gather(*endings)
            by_code = Counter(code for code, _ in outcomes)
            last_closed_s = max(closed for _, closed in outcomes) - flooded
            assert set(by_code) <= {ErrorCode.REGISTER_TIMEOUT, ErrorCode.TOO_MANY_CONNECTIONS}, (
                by_code
            )
            assert by_code[ErrorCode.TOO_MANY_CONNECTIONS] > 0  # the cap held
            assert last_closed_s < DEADLINE_S + 5  # by the deadline, not never

            view = await wait_for(lambda: coordinator.settled(4), 20, "the fourth member placed")
            joined = next(m for m in view["members"] if m["member_id"].startswith("worker-3"))
            assert joined["ranges"], "the fourth member got no slots"

            produced = await asyncio.wait_for(traffic, 60)
            await wait_for(lambda: workers.unique() >= len(produced), 30, "every record processed")
            report = check(produced, workers.processed())
            assert report.ok, report
            assert {e.worker for e in workers.processed()} >= {"worker-3"}
        finally:
            for sock in flood:
                sock.close()
            if traffic is not None and not traffic.done():
                traffic.cancel()
                await asyncio.gather(traffic, return_exceptions=True)
            workers.stop_all()
            coordinator.stop()

    log = coordinator.read_log()
    size = len(log.encode())
    print(
        f"\nflood: {FLOOD} connections opened in {opened_s:.1f} s; {dict(by_code)}; last "
        f"closed {last_closed_s:.1f} s after the flood began; log {size} bytes, "
        f"{log.count(chr(10))} lines; test {time.monotonic() - began:.0f} s"
    )
    assert f"open-file limit: soft {OPEN_FILES} (was {OPEN_FILES}), hard {OPEN_FILES}" in log
    assert size < 200_000
    assert "Traceback" not in log
    assert "socket.accept() out of system resource" not in log
