"""Bad input gets a clear error and loses nothing.

Every bad input on the consumer channel is answered with exactly one ErrorResponse (right
code, a specific message), then the coordinator closes the connection; the coordinator and
the consumers already in the group carry on as if nothing happened. Also: a wrong auth
token, an unknown group on the admin API, and a coordinator that cannot start (no broker,
a broker that never answers, a busy port) exits non-zero with a clear message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import (
    GROUP,
    CoordinatorProcess,
    Workers,
    create_topic,
    produce,
    wait_for,
)
from keyshard.consumer_client import ConsumerError, CoordinatedConsumer
from keyshard.core.protocol.codec import PROTOCOL_VERSION, FrameDecoder, encode
from keyshard.core.protocol.messages import (
    ErrorCode,
    ErrorResponse,
    LeaveRequest,
    Message,
    RegisterRequest,
    StopFetcherRequest,
)
from keyshard.local.broker import EmbeddedBroker
from keyshard.local.processes import free_port
from keyshard.local.verify import check

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_ERRORS = {
    ErrorCode.MALFORMED_FRAME,
    ErrorCode.FRAME_TOO_LARGE,
    ErrorCode.UNSUPPORTED_VERSION,
}


# --------------------------------------------------------------------------- helpers


def _frame(body: bytes, version: int = PROTOCOL_VERSION) -> bytes:
    """A frame with a correct length header around an arbitrary body."""
    return struct.pack(">I", 1 + len(body)) + bytes((version,)) + body


def _json_frame(document: dict[str, Any], version: int = PROTOCOL_VERSION) -> bytes:
    return _frame(json.dumps(document).encode(), version)


@dataclass
class Exchange:
    messages: list[Message]
    leftover: int  # bytes of an incomplete frame after EOF
    seconds: float


async def _exchange(port: int, payload: bytes, timeout: float = 10.0) -> Exchange:
    """Send `payload` on a fresh connection, read until the coordinator closes it."""
    began = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(), timeout)  # read() = until EOF
        except TimeoutError:
            raise AssertionError(
                f"the coordinator did not close the connection within {timeout} s "
                f"after {payload[:60]!r}"
            ) from None
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    decoder = FrameDecoder()
    messages = decoder.feed(data)
    return Exchange(messages, decoder.buffered_bytes, time.monotonic() - began)


def _single_error(exchange: Exchange, what: str) -> ErrorResponse:
    assert exchange.leftover == 0, f"{what}: a partial frame came back ({exchange.leftover} B)"
    assert len(exchange.messages) == 1, (
        f"{what}: expected exactly one ErrorResponse, got {exchange.messages!r}"
    )
    (error,) = exchange.messages
    assert isinstance(error, ErrorResponse), f"{what}: expected an ErrorResponse, got {error!r}"
    assert error.message.strip(), f"{what}: the error message is empty"
    return error


# --------------------------------------------------------------------------- 1: bad frames


@dataclass(frozen=True)
class BadInput:
    name: str
    payload: bytes
    codes: frozenset[ErrorCode]
    mentions: tuple[str, ...] = ()  # substrings the error message must contain
    correlation_id: int = 0


def _bad_inputs(live_member_id: str) -> list[BadInput]:
    missing_topic = f"no.such.topic-{uuid.uuid4().hex[:6]}"
    register_missing = encode(
        RegisterRequest(
            correlation_id=11,
            group=GROUP,
            topics=[missing_topic],
            consumer_name="intruder",
            session_timeout_ms=6000,
        )
    )
    stop_fetcher = encode(StopFetcherRequest(correlation_id=12, member_epoch=1, ranges=[(0, 99)]))
    # The live member's own id, from a connection that never registered: must be refused
    # and must not evict the real member.
    leave = encode(
        LeaveRequest(correlation_id=13, member_id=live_member_id, member_epoch=1, positions=[])
    )
    bad_timeout = _json_frame(
        {
            "type": "register_request",
            "correlation_id": 14,
            "group": GROUP,
            "topics": ["demo.events"],
            "consumer_name": "intruder",
            "session_timeout_ms": 5,
        }
    )
    one = frozenset
    return [
        BadInput(
            "invalid JSON behind a valid header",
            _frame(b'{"type": "ping_request", "correlation_id": '),
            one({ErrorCode.MALFORMED_FRAME}),
            ("JSON",),
        ),
        BadInput(
            "header announcing a 1 GiB frame",
            struct.pack(">I", 1 << 30),
            one({ErrorCode.FRAME_TOO_LARGE}),
            (str(1 << 30),),
        ),
        BadInput(
            "version byte 7",
            encode(RegisterRequest(**_register_fields(15)), version=7),
            one({ErrorCode.UNSUPPORTED_VERSION}),
            ("7",),
        ),
        BadInput(
            "an HTTP request",
            b"GET / HTTP/1.1\r\n\r\n",
            one(PROTOCOL_ERRORS),
        ),
        BadInput(
            "random binary",
            bytes(range(256)) * 4,
            one(PROTOCOL_ERRORS),
        ),
        BadInput(
            "frame length 1 (no JSON at all)",
            struct.pack(">I", 1) + bytes((PROTOCOL_VERSION,)),
            one({ErrorCode.MALFORMED_FRAME}),
        ),
        BadInput(
            "payload that is not UTF-8",
            _frame(b'{"type": "\xff\xfe"}'),
            one({ErrorCode.MALFORMED_FRAME}),
            ("UTF-8",),
        ),
        BadInput(
            "a JSON array instead of an object",
            _frame(b"[1, 2, 3]"),
            one({ErrorCode.INVALID_MESSAGE}),
            ("object",),
        ),
        BadInput(
            "an unknown message type",
            _json_frame({"type": "launch_missiles", "correlation_id": 16}),
            one({ErrorCode.INVALID_MESSAGE}),
            ("launch_missiles",),
            correlation_id=16,
        ),
        BadInput(
            "register for a topic that does not exist",
            register_missing,
            one({ErrorCode.UNKNOWN_TOPIC}),
            (missing_topic,),
            correlation_id=11,
        ),
        BadInput(
            "a StopFetcherRequest sent by a consumer",
            stop_fetcher,
            one({ErrorCode.UNEXPECTED_MESSAGE}),
            ("stop_fetcher_request",),
            correlation_id=12,
        ),
        BadInput(
            "a LeaveRequest before registering",
            leave,
            one({ErrorCode.UNKNOWN_MEMBER}),
            (live_member_id,),
            correlation_id=13,
        ),
        BadInput(
            "register with session_timeout_ms=5",
            bad_timeout,
            one({ErrorCode.INVALID_MESSAGE}),
            ("session_timeout_ms",),
            correlation_id=14,
        ),
    ]


def _register_fields(correlation_id: int) -> dict[str, Any]:
    return {
        "correlation_id": correlation_id,
        "group": GROUP,
        "topics": ["demo.events"],
        "consumer_name": "intruder",
        "session_timeout_ms": 6000,
    }


async def test_bad_inputs_get_one_clear_error_and_disturb_nothing(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap)
    workers.spawn("c0")
    view = await wait_for(lambda: coordinator.settled(1), 30, "1 settled member")
    (member,) = view["members"]
    member_id = member["member_id"]

    failures = []
    for bad in _bad_inputs(member_id):
        exchange = await _exchange(coordinator.listen_port, bad.payload)
        error = _single_error(exchange, bad.name)
        print(f"{bad.name}: {error.code} {error.message!r} ({exchange.seconds * 1000:.0f} ms)")
        if error.code not in bad.codes:
            failures.append(f"{bad.name}: code {error.code}, expected one of {sorted(bad.codes)}")
        missing = [m for m in bad.mentions if m not in error.message]
        if missing:
            failures.append(f"{bad.name}: message {error.message!r} does not mention {missing}")
        if error.correlation_id != bad.correlation_id:
            failures.append(
                f"{bad.name}: correlation_id {error.correlation_id}, expected {bad.correlation_id}"
            )
        assert await coordinator.healthy(), f"coordinator unhealthy after {bad.name}"
    assert not failures, "\n".join(failures)

    # Nothing else was disturbed: the one member is the same member, and it processes.
    produced = await produce(coordinator.bootstrap, 500, 50)
    await wait_for(lambda: workers.unique() >= 500, 60, "500 records processed by c0")
    report = check(produced, workers.processed())
    assert report.lost == [] and report.order_violations == [] and report.duplicates == 0
    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{coordinator.admin_url}/healthz")).status_code == 200
    view = await coordinator.group()
    assert view is not None
    assert [m["member_id"] for m in view["members"]] == [member_id], view["members"]
    assert await coordinator.settled(1), view
    assert workers.procs["c0"].poll() is None, "the worker exited"
    assert "Traceback" not in coordinator.read_log(), coordinator.read_log()[-3000:]


# --------------------------------------------------------------------------- 2: auth


async def _run_until_refused(consumer: CoordinatedConsumer) -> ConsumerError:
    async def handler(record: Any) -> None:
        raise AssertionError(f"a refused consumer got a record: {record!r}")

    try:
        with pytest.raises(ConsumerError) as info:
            await asyncio.wait_for(consumer.run(handler), 15)
    finally:
        await consumer.close()
    return info.value


async def test_auth_token_is_enforced(coordinator: CoordinatorProcess, tmp_path: Path) -> None:
    topic = f"auth-{uuid.uuid4().hex[:8]}"
    group = f"auth-group-{uuid.uuid4().hex[:6]}"
    await create_topic(coordinator.bootstrap, topic)
    log_dir = tmp_path / "auth-coordinator"
    log_dir.mkdir()
    secured = CoordinatorProcess(coordinator.bootstrap, log_dir, extra=["--auth-token", "s3cret"])

    def consumer(token: str | None) -> CoordinatedConsumer:
        return CoordinatedConsumer(
            group=group,
            topics=[topic],
            coordinator=secured.address,
            bootstrap_servers=coordinator.bootstrap,
            name=f"auth-{token}",
            session_timeout_ms=6000,
            auth_token=token,
        )

    try:
        await secured.start()

        for token in ("wrong", None, ""):
            began = time.monotonic()
            err = await _run_until_refused(consumer(token))
            print(f"token {token!r}: {err} ({time.monotonic() - began:.2f} s)")
            assert "AUTHENTICATION_FAILED" in str(err), f"token {token!r}: {err}"
        # Refused attempts leave no trace: the group was never created.
        assert await secured.group(group) is None

        ok = consumer("s3cret")
        received: list[Any] = []

        async def handler(record: Any) -> None:
            received.append(record)

        task = asyncio.create_task(ok.run(handler))
        try:
            await ok.wait_registered(15)
            assert ok.member_id is not None
            view = await wait_for(
                lambda: secured.group(group), 10, "the authenticated member's group"
            )
            assert [m["member_id"] for m in view["members"]] == [ok.member_id]
        finally:
            await ok.close()
            await asyncio.wait_for(task, 30)
        assert await secured.healthy()
        assert await coordinator.healthy(), "the first coordinator was disturbed"
    finally:
        secured.stop()


# --------------------------------------------------------------------------- 3: admin API


async def test_unknown_group_on_admin_api_is_404(coordinator: CoordinatorProcess) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"{coordinator.admin_url}/v1/groups/nope")
    assert response.status_code == 404, response.text
    assert "nope" in response.json()["detail"], response.text


# --------------------------------------------------------------------------- 4: no broker


def _run_coordinator(bootstrap: str, *, listen: int = 0, admin: int = 0) -> tuple[str, str]:
    """Run `keyshard coordinator` to its exit; returns (stdout, stderr). It must exit
    non-zero within 60 s, without a traceback."""
    command = [
        sys.executable, "-m", "keyshard", "coordinator",
        "--bootstrap-servers", bootstrap,
        "--listen", f"127.0.0.1:{listen or free_port()}",
        "--admin-listen", f"127.0.0.1:{admin or free_port()}",
    ]  # fmt: skip
    began = time.monotonic()
    try:
        result = subprocess.run(
            command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"the coordinator hung for 60 s (kafka {bootstrap}); stderr: {exc.stderr!r}"
        ) from None
    print(f"exit {result.returncode} after {time.monotonic() - began:.2f} s; stderr:")
    print(result.stderr)
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    assert "listening" not in result.stdout, result.stdout
    return result.stdout, result.stderr


def _keyshard_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("keyshard coordinator:")]
    assert len(lines) == 1, f"expected one 'keyshard coordinator:' line, stderr: {stderr!r}"
    return lines[0]


def test_coordinator_without_a_broker_exits_with_a_clear_message() -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens here
    _, stderr = _run_coordinator(dead)
    line = _keyshard_line(stderr)
    assert dead in line, f"{line!r} does not name {dead}"


def test_coordinator_with_a_silent_broker_exits_with_a_clear_message() -> None:
    """Something accepts connections on the broker address but never answers (a hung
    broker, a firewall that swallows packets): the coordinator gives up, naming it."""
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(64)  # the kernel completes handshakes; nobody ever reads
        address = f"127.0.0.1:{blackhole.getsockname()[1]}"
        _, stderr = _run_coordinator(address)
    line = _keyshard_line(stderr)
    assert address in line, f"{line!r} does not name {address}"


@pytest.mark.parametrize("which", ["listen", "admin"])
def test_coordinator_on_a_busy_port_exits_with_a_clear_message(
    broker: EmbeddedBroker, which: str
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        port = squatter.getsockname()[1]
        ports = {"listen": port} if which == "listen" else {"admin": port}
        _, stderr = _run_coordinator(broker.bootstrap_servers, **ports)
    assert [line for line in stderr.splitlines() if str(port) in line], (
        f"stderr does not name the busy port {port}: {stderr!r}"
    )
