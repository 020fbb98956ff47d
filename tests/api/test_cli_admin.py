"""`keyshard groups|status|positions|where|rebalance|fence|reset-positions` as an operator
runs them: subprocesses against a real coordinator, and one-line errors (exit 1, no
traceback) when things go wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import GROUP, TOPIC, CoordinatorProcess, Workers, create_topic, wait_for
from keyshard.cli.admin import AdminError, reset_body
from keyshard.cli.parser import build_parser
from keyshard.local.processes import free_port
from tests.api.conftest import ADMIN_ARGS, ADMIN_TOKEN

REPO_ROOT = Path(__file__).resolve().parents[2]


def keyshard(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KEYSHARD_")}
    clean.update(env, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "keyshard", *args],
        cwd=REPO_ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert needle in result.stderr


def test_daemon_down_is_one_clear_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["groups"], ["status", "g"], ["positions", "g"], ["where", "g", "k"]):
        assert_one_line_error(keyshard(*args, "--admin", url), "cannot reach the keyshard daemon")
    # The environment variable works as well as the flag.
    assert_one_line_error(keyshard("groups", KEYSHARD_ADMIN=url), url)


@pytest.mark.integration
@pytest.mark.coordinator_args(*ADMIN_ARGS)
async def test_cli_against_a_live_daemon(coordinator: CoordinatorProcess, workers: Workers) -> None:
    await create_topic(coordinator.bootstrap)
    workers.spawn("c0")
    workers.spawn("c1")
    view = await wait_for(lambda: coordinator.settled(2), 30, "2 settled members")
    admin = ("--admin", coordinator.admin_url)

    groups = keyshard("groups", *admin)
    assert groups.returncode == 0, groups.stderr
    assert GROUP in groups.stdout and "65536" in groups.stdout
    # The handoffs `groups` counts are the open ones, and `status` says how many are open.
    assert "open handoffs" in groups.stdout
    row = next(line for line in groups.stdout.splitlines() if f" {GROUP} " in line)
    still_open = int(row.split("│")[-2])
    summary = json.loads(keyshard("groups", *admin, "--json").stdout)["groups"][0]
    assert still_open == summary["open_handoffs"]

    status = keyshard("status", GROUP, *admin)
    assert status.returncode == 0, status.stderr
    for member in view["members"]:
        assert member["member_id"] in status.stdout
    assert f", {still_open} open" in status.stdout
    # Piped (not a terminal), member ids are whole however narrow: `fence` needs them.
    narrow = keyshard("status", GROUP, *admin, COLUMNS="40")
    for member in view["members"]:
        assert member["member_id"] in narrow.stdout, narrow.stdout

    positions = keyshard("positions", GROUP, *admin, "--json")
    assert positions.returncode == 0, positions.stderr
    partitions = json.loads(positions.stdout)
    assert [(p["topic"], p["partition"]) for p in partitions] == [(TOPIC, 0)], partitions
    segments = partitions[0]["segments"]
    assert segments[0]["start"] == 0 and segments[-1]["end"] == 65535, segments
    table = keyshard("positions", GROUP, *admin)
    assert table.returncode == 0, table.stderr
    assert "next offset" in table.stdout and f"{TOPIC}" in table.stdout, table.stdout
    assert_one_line_error(keyshard("positions", "nope", *admin), "unknown group 'nope'")

    where = keyshard("where", GROUP, "key-3", *admin, "--json")
    assert where.returncode == 0, where.stderr
    located = json.loads(where.stdout)
    assert located["owner"] in {m["member_id"] for m in view["members"]}
    assert "slot" in keyshard("where", GROUP, "key-3", *admin).stdout

    assert_one_line_error(keyshard("status", "nope", *admin), "unknown group 'nope'")
    assert_one_line_error(keyshard("rebalance", GROUP, *admin), "authentication needed")
    assert_one_line_error(
        keyshard("rebalance", GROUP, *admin, KEYSHARD_ADMIN_TOKEN="wrong"),
        "not allowed: wrong admin token",
    )
    assert_one_line_error(
        keyshard("fence", GROUP, "x", *admin, KEYSHARD_ADMIN_TOKEN="wrong"), "wrong admin token"
    )
    rebalance = keyshard("rebalance", GROUP, *admin, KEYSHARD_ADMIN_TOKEN=ADMIN_TOKEN)
    assert rebalance.returncode == 0, rebalance.stderr
    assert "0 moved" in rebalance.stdout

    victim = view["members"][0]["member_id"]
    fence = keyshard("fence", GROUP, victim, *admin, KEYSHARD_ADMIN_TOKEN=ADMIN_TOKEN)
    assert fence.returncode == 0, fence.stderr
    assert f"member {victim} of group {GROUP} fenced" in fence.stdout
    assert_one_line_error(
        keyshard("fence", GROUP, victim, *admin, KEYSHARD_ADMIN_TOKEN=ADMIN_TOKEN), "has no member"
    )


def test_reset_flags_make_the_api_request() -> None:
    def body(*flags: str) -> dict[str, object]:
        return reset_body(build_parser().parse_args(["reset-positions", GROUP, *flags]))

    assert body("--to-earliest") == {"execute": False, "to": "earliest"}
    assert body("--to-latest", "--execute", "--topic", "t.a-b_c") == {
        "execute": True, "to": "latest", "topic": "t.a-b_c",
    }  # fmt: skip
    assert body("--to-offset", "7", "--topic", "orders:3", "--slots", "0-4095") == {
        "execute": False, "to": "offset", "offset": 7, "topic": "orders", "partition": 3,
        "slots": [0, 4095],
    }  # fmt: skip
    assert body("--to-datetime", "2026-11-27T09:00:00Z")["datetime"] == "2026-11-27T09:00:00Z"
    assert body("--to-committed")["to"] == "committed"
    with pytest.raises(AdminError, match="expected A-B"):
        body("--to-earliest", "--slots", "12")
    with pytest.raises(SystemExit):  # exactly one --to-*
        body("--to-earliest", "--to-latest")
