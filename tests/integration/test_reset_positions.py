"""A poisoned group repaired by `keyshard reset-positions`, as an operator runs it.

A group's positions are pushed past records nobody processed (a reset to the end while
a backlog waits: what a lying client did before reports were checked), then reset to an
offset before them; the workers started afterwards process every record after the
reset point again, in key order, and none before it. The reset is refused while members
own the slots (naming them) and without the admin token; a dry run changes nothing.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from harness import GROUP, CoordinatorProcess, Workers, create_topic, produce, wait_for
from keyshard.local.verify import Processed, check
from tests.api.conftest import ADMIN_ARGS, ADMIN_TOKEN
from tests.api.test_cli_admin import assert_one_line_error, keyshard

pytestmark = [pytest.mark.integration, pytest.mark.coordinator_args(*ADMIN_ARGS)]

PARTITIONS = 2
RESET_TO = 100  # each partition holds about 500 records: some before it, most after
TOKEN = {"KEYSHARD_ADMIN_TOKEN": ADMIN_TOKEN}


def next_offsets(admin: tuple[str, str]) -> dict[int, set[int]]:
    """Per partition, the next offsets `keyshard positions` shows for its slot ranges."""
    shown = keyshard("positions", GROUP, *admin, "--json")
    assert shown.returncode == 0, shown.stderr
    return {
        p["partition"]: {s["next_offset"] for s in p["segments"]} for p in json.loads(shown.stdout)
    }


def reset(admin: tuple[str, str], *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    return keyshard("reset-positions", GROUP, *flags, *admin, **env)


async def test_a_poisoned_group_is_repaired_by_a_reset(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap, partitions=PARTITIONS)
    admin = ("--admin", coordinator.admin_url)
    workers.spawn("w0")
    workers.spawn("w1")
    view = await wait_for(lambda: coordinator.settled(2), 60, "two members settled")
    first = await produce(coordinator.bootstrap, 600, 60)
    await wait_for(lambda: workers.unique() >= 600, 60, "the first 600 records processed")

    # While members own the slots: refused, naming them; and never without the token.
    refused = reset(admin, "--to-earliest", **TOKEN)
    assert_one_line_error(refused, "members own slots of the reset")
    for member in view["members"]:
        assert member["member_id"] in refused.stderr
    assert_one_line_error(reset(admin, "--to-earliest", "--execute"), "authentication needed")

    workers.stop("w0")
    workers.stop("w1")

    async def empty() -> bool:
        group = await coordinator.group()
        return group is not None and not group["members"]

    await wait_for(empty, 30, "the workers left the group")
    backlog = await produce(coordinator.bootstrap, 400, 60, start=600)
    produced = first + backlog
    ends = {p: 1 + max(r.offset for r in produced if r.partition == p) for p in range(PARTITIONS)}

    # The poison: a reset to the end skips the backlog nobody processed.
    poisoned = reset(admin, "--to-latest", "--execute", **TOKEN)
    assert poisoned.returncode == 0, poisoned.stderr
    assert next_offsets(admin) == {p: {end} for p, end in ends.items()}

    # A dry run shows before and after per partition and slot range, and changes nothing.
    dry = reset(admin, "--to-offset", str(RESET_TO), **TOKEN)
    assert dry.returncode == 0, dry.stderr
    assert "dry run, nothing changed" in dry.stdout and "--execute" in dry.stdout, dry.stdout
    moves = json.loads(reset(admin, "--to-offset", str(RESET_TO), "--json", **TOKEN).stdout)
    assert not moves["executed"]
    assert {(m["partition"], m["before"], m["after"]) for m in moves["moves"]} == {
        (p, end, RESET_TO) for p, end in ends.items()
    }
    assert next_offsets(admin) == {p: {end} for p, end in ends.items()}

    # To a time (Kafka's offsets_for_times): before every record, its first offset;
    # after every record, the end.
    for when, expected in (("2000-01-01T00:00:00Z", 0), ("2100-01-01T00:00:00", None)):
        planned = reset(admin, "--to-datetime", when, "--json", **TOKEN)
        assert planned.returncode == 0, planned.stderr
        afters = {(m["partition"], m["after"]) for m in json.loads(planned.stdout)["moves"]}
        assert afters == {(p, end if expected is None else expected) for p, end in ends.items()}

    # The repair.
    repaired = reset(admin, "--to-offset", str(RESET_TO), "--execute", **TOKEN)
    assert repaired.returncode == 0, repaired.stderr
    assert next_offsets(admin) == {p: {RESET_TO} for p in range(PARTITIONS)}
    assert f"positions reset to offset {RESET_TO} by an operator" in coordinator.read_log()

    workers.spawn("w2")
    workers.spawn("w3")
    again = [r for r in produced if r.offset >= RESET_TO]

    def second_run() -> list[Processed]:
        return [e for e in workers.processed() if e.worker in {"w2", "w3"}]

    await wait_for(
        lambda: len({(e.partition, e.offset) for e in second_run()}) >= len(again),
        90,
        f"the {len(again)} records after the reset point processed again",
    )
    report = check(again, second_run())
    assert report.lost == [], report.lost[:20]
    assert report.order_violations == [], report.order_violations[:5]
    assert all(e.offset >= RESET_TO for e in second_run())
    assert "Traceback" not in coordinator.read_log()
