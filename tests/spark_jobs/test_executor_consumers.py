"""Spark tasks as coordinated consumers, on a real broker and coordinator.

The job runs as its own local[4] Spark application in a subprocess (the shared `spark`
fixture is local[2], and a JVM hosts one SparkContext), stopped by pid whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import CoordinatorProcess, create_topic, produce, wait_for
from keyshard.core.model.ranges import RangeSet
from keyshard.local.processes import stop_process
from keyshard.local.verify import Processed, check, read_processed
from tests.spark_jobs.handlers import OUT_ENV

pytestmark = [pytest.mark.integration, pytest.mark.brokers("tansu", "kafka")]
REPO = Path(__file__).resolve().parents[2]
GROUP = "spark-consumers"
TOPIC = "spark.clicks"


def _job(coordinator: CoordinatorProcess, tmp: Path, *extra: str) -> subprocess.Popen[bytes]:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    env = {**os.environ, OUT_ENV: str(out), "PYTHONPATH": str(REPO)}
    log = open(tmp / "job.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "keyshard.spark_jobs.executors",
            "--group", GROUP, "--topics", TOPIC,
            "--coordinator", coordinator.address,
            "--bootstrap-servers", coordinator.bootstrap,
            "--handler", "tests.spark_jobs.handlers:log_record",
            "--session-timeout-ms", "3000",
            *extra,
        ],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    return proc


def _processed(tmp: Path) -> list[Processed]:
    return read_processed((tmp / "out").glob("*.jsonl"))


def _unique(tmp: Path) -> int:
    return len({(e.partition, e.offset) for e in _processed(tmp)})


def _alive(proc: subprocess.Popen[bytes], tmp: Path) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"the Spark job exited: {(tmp / 'job.log').read_text()[-3000:]}")


async def test_four_spark_tasks_share_one_partition_and_survive_a_lost_worker(
    coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    await create_topic(coordinator.bootstrap, TOPIC, partitions=1)
    before = await produce(coordinator.bootstrap, 300, 100, topic=TOPIC)
    stop_file = tmp_path / "stop"
    stats_file = tmp_path / "stats.json"
    # local[4,2]: 4 task slots, and a failed task is retried once (a lost executor's task
    # comes back as a new member, as it would on a cluster).
    job = _job(
        coordinator, tmp_path,
        "--consumers", "4", "--master", "local[4,2]",
        "--stop-file", str(stop_file), "--stats", str(stats_file),
    )  # fmt: skip
    try:

        async def settled(members: int) -> dict[str, Any] | None:
            _alive(job, tmp_path)
            return await coordinator.settled(members, GROUP)

        view = await wait_for(lambda: settled(4), 120, "4 Spark tasks owning every slot")
        ranges = {m["member_id"]: RangeSet.from_pairs(m["ranges"]) for m in view["members"]}
        assert all(r.size > 0 for r in ranges.values()), ranges
        assert sum(r.size for r in ranges.values()) == 65536

        # lz4 and zstd: what Java producers are commonly set to, decoded by every task.
        after = await produce(
            coordinator.bootstrap, 1000, 400, topic=TOPIC, start=300, compression="lz4"
        )
        after += await produce(
            coordinator.bootstrap, 1000, 400, topic=TOPIC, start=1300, compression="zstd"
        )
        produced = before + after
        await wait_for(lambda: _unique(tmp_path) >= len(produced), 60, "every record processed")
        processed = _processed(tmp_path)
        report = check(produced, processed)
        assert report.lost == [] and report.order_violations == []
        assert report.duplicates == 0  # joins are graceful handoffs: exactly once
        late = [e for e in processed if e.offset >= after[0].offset]
        assert {e.member for e in late} == set(ranges), "every task processed a part"

        # A lost executor: kill -9 one Python worker that owns slots.
        by_member = {e.member: e.worker for e in late}
        victim_member, victim_worker = next(iter(by_member.items()))
        os.kill(int(victim_worker.removeprefix("pid-")), signal.SIGKILL)
        more = await produce(coordinator.bootstrap, 1500, 400, topic=TOPIC, start=2300)
        produced += more

        async def recovered() -> dict[str, Any] | None:
            view = await settled(4)
            if view is None or victim_member in {m["member_id"] for m in view["members"]}:
                return None
            return view

        await wait_for(recovered, 60, "the lost task's slots on live members, 4 members again")
        await wait_for(lambda: _unique(tmp_path) >= len(produced), 60, "every record processed")
        processed = _processed(tmp_path)
        report = check(produced, processed)
        assert report.lost == [] and report.order_violations == []
        workers_of: dict[tuple[int, int], set[str]] = {}
        for e in processed:
            workers_of.setdefault((e.partition, e.offset), set()).add(e.worker)
        duplicated = {k: w for k, w in workers_of.items() if len(w) > 1}
        assert all(victim_worker in w for w in duplicated.values()), duplicated
        print(f"duplicates after kill -9 of a Python worker: {report.duplicates}")

        stop_file.touch()
        assert job.wait(timeout=60) == 0, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        stop_process(job, timeout=20)
    stats = json.loads(stats_file.read_text())
    assert [s["task"] for s in stats] == [0, 1, 2, 3]
    assert all(s["stopped_by"] == "stop-file" and s["slots"] > 0 for s in stats), stats
    assert sorted(s["attempt"] for s in stats) == [0, 0, 0, 1]
