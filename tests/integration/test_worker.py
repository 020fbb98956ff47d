"""`keyshard worker module:function` on the real brokers, as an application team runs it:
it processes a topic, a SIGTERM mid-stream hands its ranges over gracefully (zero
duplicates, the ranges running elsewhere well before its session timeout), its /readyz
follows the coordinator going away and coming back, and a wrong address or a refusal is
said at once, in one line when fatal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import (
    CoordinatorProcess,
    ReplicaSet,
    Workers,
    create_topic,
    is_settled,
    produce,
    wait_for,
)
from keyshard.consumer_client import ConsumerError, CoordinatedConsumer
from keyshard.core.model.ranges import RangeSet
from keyshard.local.processes import free_port, stop_process
from keyshard.local.verify import check
from tests.deploy.chart import DASHBOARD
from tests.deploy.test_kubernetes_doc import dashboard_metric_names

pytestmark = pytest.mark.integration
SESSION_MS = 20_000  # long: a handoff that waited for it would stand out


async def _get(url: str) -> httpx.Response | None:
    try:
        async with httpx.AsyncClient(timeout=2) as client:
            return await client.get(url)
    except httpx.HTTPError:
        return None


async def _status(url: str) -> int | None:
    response = await _get(url)
    return None if response is None else response.status_code


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Children started meanwhile inherit SIGINT ignored, as a non-interactive shell starts
    a background job (`cmd &`)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


async def _sigterm_hands_over(
    coordinator: CoordinatorProcess, workers: Workers, leaver: str, stayer: str
) -> None:
    """With `leaver` and `stayer` (started) owning the group, a SIGTERM to `leaver` under
    load: it exits 0 with a graceful Leave (its ranges move without waiting out the
    session timeout) and nothing is lost, reordered or processed twice."""
    await wait_for(lambda: coordinator.settled(2), 60, "2 workers owning every slot")
    producing = asyncio.ensure_future(produce(coordinator.bootstrap, 4000, 300, rate=500))
    await wait_for(lambda: workers.unique() > 500, 60, "traffic to flow")
    view = await coordinator.group()
    assert view is not None
    leaving = next(m for m in view["members"] if m["name"] == leaver)
    assert RangeSet.from_pairs(leaving["ranges"]).size > 0

    termed_at = time.monotonic()  # the coordinator's handoff times are CLOCK_MONOTONIC
    workers.procs[leaver].send_signal(signal.SIGTERM)
    settled = await wait_for(lambda: coordinator.settled(1), 60, f"{stayer} owning everything")
    assert await wait_for(lambda: workers.procs[leaver].poll() is not None, 60, "it to exit")
    assert workers.procs[leaver].returncode == 0, workers.output(leaver, "err")
    assert not producing.done(), "the SIGTERM must come under load"
    handoffs = [
        h for h in settled["handoffs"]
        if h["from_member"] == leaving["member_id"] and h["started_at"] >= termed_at
    ]  # fmt: skip
    # A graceful Leave, not a lost member: its ranges moved without waiting out the
    # session (the crash case waits 20 s plus a margin here).
    assert handoffs and {h["kind"] for h in handoffs} == {"leave"}, handoffs
    resumed = max(h["resumed_at"] for h in handoffs) - termed_at
    print(f"{leaver}'s ranges running on {stayer} {resumed:.3f} s after its SIGTERM")
    assert resumed < SESSION_MS / 1000

    produced = await producing
    await wait_for(lambda: workers.unique() >= len(produced), 120, "every record processed")
    report = check(produced, workers.processed())
    assert report.lost == [] and report.order_violations == []
    assert report.duplicates == 0, "a SIGTERM must not duplicate"
    assert report.per_worker[leaver] > 0 and report.per_worker[stayer] > 0
    assert "SIGTERM: closing gracefully" in workers.output(leaver)


@pytest.mark.parametrize("sigint", ["default", "ignored"])
async def test_worker_processes_and_a_sigterm_mid_stream_hands_over_without_duplicates(
    coordinator: CoordinatorProcess, workers: Workers, sigint: str
) -> None:
    """Also when started as a shell script's background job, with SIGINT ignored: the
    worker owns its process, so it takes both signals whatever it inherited."""
    await create_topic(coordinator.bootstrap)
    session = ("--session-timeout-ms", str(SESSION_MS))
    metrics_port = free_port()
    with sigint_ignored() if sigint == "ignored" else contextlib.nullcontext():
        workers.spawn_cli("w0", *session, "--metrics-listen", f"127.0.0.1:{metrics_port}")
    workers.spawn_cli("w1", *session, "--log-format", "json")
    await _sigterm_hands_over(coordinator, workers, "w0", "w1")
    assert "not taking over" not in workers.output("w0")
    assert workers.output("w0", "err") == ""  # nothing fatal: stderr stays empty
    for line in workers.output("w1").splitlines():  # --log-format json: every line parses
        assert {"time", "level", "logger", "message"} <= json.loads(line).keys()


async def test_a_library_app_with_its_own_ctrl_c_handler_still_closes_on_sigterm(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """The app handles SIGINT itself and not SIGTERM: the consumer leaves SIGINT to it,
    says so, and takes SIGTERM. Started with SIGINT ignored first, as a shell's
    background job is: the app's own handler replaces that."""
    await create_topic(coordinator.bootstrap)
    variables = {
        **os.environ,
        "KEYSHARD_GROUP": workers.group, "KEYSHARD_TOPICS": workers.topic,
        "KEYSHARD_COORDINATOR": coordinator.address,
        "KEYSHARD_BOOTSTRAP_SERVERS": coordinator.bootstrap, "KEYSHARD_NAME": "app",
        "KEYSHARD_SESSION_TIMEOUT_MS": str(SESSION_MS),
        "KEYSHARD_TEST_OUT": str(workers.out_dir / "app.jsonl"),
    }  # fmt: skip
    with (
        open(workers.out_dir / "app.log", "wb") as out,
        open(workers.out_dir / "app.err", "wb") as err,
        sigint_ignored(),
    ):
        workers.procs["app"] = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.sigint_app"],
            stdout=out, stderr=err, env=variables,
        )  # fmt: skip
    workers.spawn_cli("w1", "--session-timeout-ms", str(SESSION_MS))
    await _sigterm_hands_over(coordinator, workers, "app", "w1")
    assert (
        "app: not taking over SIGINT: the app handles it (on_ctrl_c) (SIGTERM closes "
        "gracefully)" in workers.output("app")
    )
    assert workers.output("app", "err") == ""


async def test_worker_readiness_follows_the_coordinator(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """Ready once registered; unready once no coordinator spoke for a session timeout;
    ready again when one is back. /healthz stays 200 all along; /metrics serves."""
    await create_topic(coordinator.bootstrap)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    workers.spawn_cli("w0", "--session-timeout-ms", "3000", "--metrics-listen", f"127.0.0.1:{port}")
    assert await wait_for(lambda: _status(f"{base}/healthz"), 30, "/healthz") == 200
    await wait_for(lambda: _ready_is(base, 200), 30, "/readyz 200 once registered")
    await produce(coordinator.bootstrap, 200, 50)
    await wait_for(lambda: workers.unique() >= 200, 60, "200 records processed")
    wanted = (
        'keyshard_consumer_records_processed_total{topic="demo.events"} 200.0',
        "keyshard_consumer_owned_slots 65536.0",
    )

    async def metrics_show_them() -> bool:
        metrics = await _get(f"{base}/metrics")
        return (
            metrics is not None
            and metrics.status_code == 200
            and all(line in metrics.text for line in wanted)
        )

    # The gauges are sampled once a second: the records may all be done before the first
    # sample that follows the grant.
    await wait_for(metrics_show_them, 10, "/metrics with the records processed and the slots")

    coordinator.stop()
    unready = await wait_for(lambda: _ready_is(base, 503), 30, "/readyz 503 without coordinator")
    assert "no coordinator heard from" in unready or "not registered" in unready
    assert await _status(f"{base}/healthz") == 200  # alive: no restart wanted
    await coordinator.start()
    await wait_for(lambda: _ready_is(base, 200), 60, "/readyz 200 with the coordinator back")
    assert workers.procs["w0"].poll() is None


async def test_worker_stays_ready_through_a_coordinator_failover(
    broker: Any, tmp_path: Path
) -> None:
    """Two replicas; the one serving the group is killed. The worker runs on on its lease
    and re-registers with the other: /readyz never leaves 200 meanwhile."""
    replicas = ReplicaSet(broker.bootstrap_servers, tmp_path, extra=["--drain-timeout-ms", "2000"])
    workers = Workers(CoordinatorProcess(broker.bootstrap_servers, tmp_path), tmp_path)
    try:
        await replicas.start("r0", "r1")
        workers.addresses = replicas.addresses  # both, as a headless Service gives them
        await create_topic(replicas.bootstrap)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        workers.spawn_cli("w0", "--metrics-listen", f"127.0.0.1:{port}")
        await wait_for(lambda: replicas.settled(1), 60, "w0 owning every slot")
        await wait_for(lambda: _ready_is(base, 200), 30, "/readyz 200")
        owner = await replicas.owner()
        assert owner is not None
        (other,) = [r for r in replicas.replicas.values() if r is not owner]
        owner.kill()
        codes: list[int | None] = []

        async def back_on_the_other() -> bool:
            codes.append(await _status(f"{base}/readyz"))
            try:
                view = await other.group()
            except httpx.HTTPError:  # still forwarded to the dead owner
                return False
            return (
                view is not None
                and view["served_by"]["replica_id"] == other.replica_id
                and (is_settled(view, 1))
            )

        await wait_for(back_on_the_other, 60, "the other replica serving w0")
        assert set(codes) == {200}, codes
        assert await _status(f"{base}/readyz") == 200
    finally:
        workers.stop_all()
        replicas.stop_all()


async def _ready_is(base: str, code: int) -> str | None:
    response = await _get(f"{base}/readyz")
    if response is None or response.status_code != code:
        return None
    return response.text or "empty"


async def test_a_second_sigterm_aborts_a_drain_that_does_not_end(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap)
    port = free_port()
    proc = workers.spawn_cli(
        "w0", "--metrics-listen", f"127.0.0.1:{port}",
        target="tests.integration.worker_app:handle_stuck",
    )  # fmt: skip
    await wait_for(lambda: coordinator.settled(1), 60, "w0 owning every slot")
    await produce(coordinator.bootstrap, 20, 20)

    async def stuck() -> bool:
        response = await _get(f"http://127.0.0.1:{port}/metrics")
        return response is not None and "keyshard_consumer_in_flight 20.0" in response.text

    await wait_for(stuck, 30, "20 handlers stuck")
    proc.send_signal(signal.SIGTERM)
    await wait_for(lambda: "SIGTERM: closing gracefully" in workers.output("w0"), 30, "closing")
    assert proc.poll() is None, "the drain waits for the stuck handlers (30 s by default)"
    proc.send_signal(signal.SIGTERM)
    await wait_for(lambda: proc.poll() is not None, 30, "w0 to abort")
    assert proc.returncode == 130
    err = workers.output("w0", "err").strip().splitlines()
    assert len(err) == 1 and "aborted by a second signal" in err[0], err


def _exported(text: str) -> set[str]:
    """Metric names of the samples of a /metrics answer (histograms as _bucket, _sum...)."""
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1].isalpha()}


@pytest.mark.brokers("tansu")
async def test_every_metric_the_dashboard_queries_is_exported(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """The chart's Grafana dashboard against a running coordinator and two workers, after
    traffic and a handoff (some series exist only from then on)."""
    await create_topic(coordinator.bootstrap)
    ports = [free_port(), free_port()]
    workers.spawn_cli("w0", "--metrics-listen", f"127.0.0.1:{ports[0]}")
    await wait_for(lambda: coordinator.settled(1), 60, "w0 owning every slot")
    await produce(coordinator.bootstrap, 100, 20)
    await wait_for(lambda: workers.unique() >= 100, 60, "100 records processed")
    workers.spawn_cli("w1", "--metrics-listen", f"127.0.0.1:{ports[1]}")
    await wait_for(lambda: coordinator.settled(2), 60, "w1 owning its share")
    wanted = dashboard_metric_names(json.loads(DASHBOARD.read_text(encoding="utf-8")))
    urls = [f"{coordinator.admin_url}/metrics", *(f"http://127.0.0.1:{p}/metrics" for p in ports)]
    missing: set[str] = set()

    async def covered() -> bool:
        """Gauges come from a snapshot taken once a second: wait for the next ones."""
        exported: set[str] = set()
        for url in urls:
            response = await _get(url)
            exported |= _exported(response.text) if response is not None else set()
        missing.clear()
        missing.update(wanted - exported)
        return not missing

    with contextlib.suppress(AssertionError):
        await wait_for(covered, 30, "every metric the dashboard queries")
    assert not missing, f"the dashboard queries metrics nothing exports: {sorted(missing)}"


def _json_lines(text: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _at(line: dict[str, str]) -> float:
    return datetime.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


async def test_a_wrong_coordinator_address_warns_at_once_and_the_timeout_exits(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap)
    wrong = f"127.0.0.1:{free_port()}"
    proc = workers.spawn_cli(
        "w0", "--log-format", "json", "--connect-timeout-ms", "4000",
        env={"KEYSHARD_COORDINATOR": wrong},
    )  # fmt: skip
    await wait_for(lambda: proc.poll() is not None, 60, "the worker to give up")
    lines = _json_lines(workers.output("w0"))
    started = next(line for line in lines if line["message"].startswith("worker w0:"))
    warning = next(line for line in lines if line["level"] == "WARNING")
    assert warning["message"].startswith(f"cannot reach the coordinator at {wrong}: ")
    print(f"first warning {_at(warning) - _at(started):.3f} s after the worker started")
    assert _at(warning) - _at(started) < 2.0
    assert proc.returncode == 1
    err = workers.output("w0", "err").strip().splitlines()
    assert len(err) == 1, err
    assert f"cannot reach the coordinator at {wrong} within the connect timeout (4 s)" in err[0]


async def test_connect_timeout_raises_in_the_library(coordinator: CoordinatorProcess) -> None:
    await create_topic(coordinator.bootstrap)
    wrong = f"127.0.0.1:{free_port()}"
    consumer = CoordinatedConsumer(
        group="g", topics=["demo.events"], coordinator=wrong,
        bootstrap_servers=coordinator.bootstrap, connect_timeout_ms=1500, handle_signals=False,
    )  # fmt: skip
    with pytest.raises(ConsumerError, match=f"coordinator at {wrong} within the connect timeout"):
        await asyncio.wait_for(consumer.run(lambda record: asyncio.sleep(0)), 60)


async def test_the_admin_port_given_as_the_coordinator_is_one_line_and_exit_1(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """The admin API answers in HTTP: said at once, naming the consumer port, not retried
    as a frame of 1213486160 bytes."""
    await create_topic(coordinator.bootstrap)
    admin = f"127.0.0.1:{coordinator.admin_port}"
    proc = workers.spawn_cli("w0", env={"KEYSHARD_COORDINATOR": admin})
    await wait_for(lambda: proc.poll() is not None, 60, "the worker to exit")
    assert proc.returncode == 1
    err = workers.output("w0", "err").strip().splitlines()
    assert len(err) == 1, err
    assert f"{admin} answers in HTTP: it is keyshard's admin API" in err[0]
    assert "consumers connect to the consumer port (7171 by default" in err[0]
    assert "FRAME_TOO_LARGE" not in workers.output("w0")


async def test_an_unknown_topic_is_one_line_and_exit_1(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    proc = workers.spawn_cli("w0", env={"KEYSHARD_TOPICS": "no.such.topic"})
    await wait_for(lambda: proc.poll() is not None, 60, "the worker to exit")
    assert proc.returncode == 1
    err = workers.output("w0", "err").strip().splitlines()
    assert len(err) == 1 and "no.such.topic" in err[0], err


@pytest.mark.coordinator_args("--auth-token", "the-right-token")
async def test_a_wrong_token_is_one_line_without_the_token(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap)
    proc = workers.spawn_cli("w0", env={"KEYSHARD_AUTH_TOKEN": "a-wrong-token"})
    await wait_for(lambda: proc.poll() is not None, 60, "the worker to exit")
    assert proc.returncode == 1
    err = workers.output("w0", "err").strip().splitlines()
    assert len(err) == 1 and "AUTHENTICATION_FAILED" in err[0], err
    everything = workers.output("w0") + workers.output("w0", "err")
    assert "a-wrong-token" not in everything and "the-right-token" not in everything


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nonsense", "is not MODULE:FUNCTION"),
        ("no_such_module_xyz:handle", "cannot import no_such_module_xyz"),
        ("tests.integration.worker_app:missing", "has no attribute missing"),
        ("tests.integration.worker_app:not_a_function", "is not a function"),
    ],
)
def test_a_bad_module_path_is_one_line_and_exit_2(
    target: str, message: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keyshard", "worker", target, "--group", "g",
         "--topics", "t", "--bootstrap-servers", "127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


async def test_a_sigterm_while_kafka_is_unreachable_still_stops_the_worker(
    tmp_path: Path,
) -> None:
    """Nothing listens at the Kafka address: the worker warns and retries, and a SIGTERM
    ends it at once rather than after Kafka."""
    log = tmp_path / "w.log"
    kafka = f"127.0.0.1:{free_port()}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keyshard", "worker",
             "tests.integration.worker_app:handle", "--group", "g", "--topics", "t",
             "--bootstrap-servers", kafka, "--coordinator", f"127.0.0.1:{free_port()}"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        warned = f"WARNING keyshard.consumer_client._consumer: cannot reach Kafka at {kafka}"
        await wait_for(lambda: warned in log.read_text(), 30, "the Kafka warning")
        proc.send_signal(signal.SIGTERM)
        await wait_for(lambda: proc.poll() is not None, 30, "the worker to stop")
        assert proc.returncode == 0, log.read_text()
    finally:
        stop_process(proc)
