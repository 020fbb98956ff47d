"""Reports judged in arrival order, against partition ends Kafka confirmed after they
arrived (`coordinator.runtime.report_order`, `.confirmed_ends`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.records import MemberContacted
from keyshard.coordinator.group.reports import KnownEnds
from keyshard.coordinator.runtime.confirmed_ends import ConfirmedEnds
from keyshard.coordinator.runtime.report_order import ReportJudge
from keyshard.coordinator.runtime.verdicts import PendingReplies
from keyshard.core.model.positions import TopicPartition

TP = ("t", 0)


class Kafka:
    """High watermarks that answer when released, each question recorded."""

    def __init__(self, end: int) -> None:
        self.end = end
        self.questions: list[dict[TopicPartition, int]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.down = False

    async def high_watermarks(
        self, partitions: Sequence[TopicPartition], needed: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        self.questions.append(dict(needed))
        await self.release.wait()
        if self.down:
            raise ConnectionError("no broker")
        return dict.fromkeys(partitions, self.end)


def needs(offset: int):  # type: ignore[no-untyped-def]
    """A judge for a report naming `offset` of TP: confirm first unless it is within
    the known end; then a record saying how it was judged."""

    def judge(known: KnownEnds) -> Result:
        end = known.ends.get(TP)
        if end is not None and offset <= end:
            return Result(records=[MemberContacted(f"ok {offset}", 0.0)])
        if TP in known.confirmed:
            return Result(records=[MemberContacted(f"lie {offset}", 0.0)])
        if TP in known.unconfirmable:
            return Result(records=[MemberContacted(f"clipped {offset}", 0.0)])
        return Result(confirm={TP: offset})

    return judge


class Harness:
    def __init__(self, kafka: Kafka) -> None:
        self.ends = ConfirmedEnds(kafka, ask_again_after_s=(0.01, 0.01))  # type: ignore[arg-type]
        self.replies = PendingReplies()
        self.applied: list[str] = []
        self.heard: list[str] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.judge = ReportJudge(
            ends=self.ends, replies=self.replies, run=self.run, heard=self.hear,
            spawn=self.spawn,
        )  # fmt: skip

    def run(self, group: str, result: Result) -> None:
        self.applied += [r.member_id for r in result.records if isinstance(r, MemberContacted)]

    def hear(self, group: str, member_id: str) -> None:
        self.heard.append(member_id)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        self.tasks.append(asyncio.create_task(coro, name=name))

    async def settle(self) -> None:
        await asyncio.wait_for(asyncio.gather(*self.tasks), 5.0)


async def test_a_report_within_the_known_ends_is_judged_at_once() -> None:
    kafka = Kafka(end=100)
    h = Harness(kafka)
    h.ends.learned({TP: 50})
    h.judge.submit("g", "m", needs(50))
    assert h.applied == ["ok 50"] and not h.tasks and not kafka.questions and not h.heard


async def test_later_reports_wait_behind_one_being_confirmed() -> None:
    """Positions are checked against what is stored: judged out of order, an honest
    member's older report would look behind its newer one."""
    kafka = Kafka(end=100)
    kafka.release.clear()
    h = Harness(kafka)
    h.ends.learned({TP: 50})
    h.judge.submit("g", "m", needs(80))
    h.judge.submit("g", "m", needs(40))  # within the known end, but after the first
    h.judge.submit("g", "other", needs(30))  # another member's: not held up
    assert h.applied == ["ok 30"] and h.heard == ["m", "m"], "alive meanwhile"
    await asyncio.sleep(0.01)
    assert h.replies.unhandled("g", "m"), "a verdict on it waits for the judging"
    kafka.release.set()
    await h.settle()
    assert h.applied == ["ok 30", "ok 80", "ok 40"]
    assert not h.replies.unhandled("g", "m")


async def test_reports_arriving_together_share_one_question() -> None:
    kafka = Kafka(end=1000)
    kafka.release.clear()
    h = Harness(kafka)
    for i in range(50):
        h.judge.submit("g", f"m{i}", needs(100 + i))
    await asyncio.sleep(0.01)
    h.judge.submit("g", "late", needs(500))  # the question was asked: the next one
    kafka.release.set()
    await h.settle()
    assert kafka.questions == [{TP: 149}, {TP: 500}]  # the furthest each needs
    assert sorted(h.applied) == sorted([f"ok {100 + i}" for i in range(50)] + ["ok 500"])


async def test_an_answer_still_short_is_asked_again_before_it_stands() -> None:
    kafka = Kafka(end=10)
    h = Harness(kafka)
    h.judge.submit("g", "liar", needs(2**62))
    await h.settle()
    assert len(kafka.questions) == 3
    assert h.applied == [f"lie {2**62}"]


async def test_kafka_unreachable_clips_instead_of_judging() -> None:
    kafka = Kafka(end=10)
    kafka.down = True
    h = Harness(kafka)
    h.judge.submit("g", "m", needs(20))
    await h.settle()
    assert h.applied == ["clipped 20"]


async def test_submitted_waits_for_the_result() -> None:
    kafka = Kafka(end=100)
    h = Harness(kafka)
    result = await h.judge.submitted("g", "m", needs(70))
    assert result is not None and h.applied == ["ok 70"]
