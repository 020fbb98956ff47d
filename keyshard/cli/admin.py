"""`keyshard groups|status|positions|where|rebalance|fence|reset-positions`: the CLI over the
admin HTTP API.

The CLI holds no logic of its own, only HTTP calls and tables: whatever it shows, the API
and the dashboard show too. Every failure an operator can cause (daemon down, wrong
token, unknown group) is one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.table import Table

from keyshard.cli.secret_flags import take_secret
from keyshard.core.security.secret_files import SecretFileError

TIMEOUT_S = 10.0
TOKEN_VARIABLE = "KEYSHARD_ADMIN_TOKEN"  # --token's (the daemon's --admin-token)
UNCUT_WIDTH = 10_000


class AdminError(Exception):
    """A one-line, operator-facing failure."""


def run_admin_command(args: argparse.Namespace) -> int:
    # httpx logs every request at INFO: noise on an operator's terminal, not an error.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Piped or redirected, lines are not cut to a terminal's width: a member id is copied
    # from `status` into `fence`, whole.
    console = Console() if sys.stdout.isatty() else Console(width=UNCUT_WIDTH)
    try:
        take_secret(args, "token", "--token", command=args.command, variable=TOKEN_VARIABLE)
        data = _call(args)
    except (AdminError, SecretFileError) as err:
        print(f"keyshard {args.command}: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data["partitions"] if args.command == "positions" else data, indent=2))
        return 0
    _show(args, data, console)
    return 0


def _call(args: argparse.Namespace) -> Any:
    base = str(args.admin).rstrip("/")
    group = _segment(getattr(args, "group", ""))
    match args.command:
        case "groups":
            return _request(args, "GET", f"{base}/v1/groups")
        case "status":
            return {
                "group": _request(args, "GET", f"{base}/v1/groups/{group}"),
                "handoffs": _request(args, "GET", f"{base}/v1/groups/{group}/handoffs"),
            }
        case "positions":
            return _request(args, "GET", f"{base}/v1/groups/{group}")
        case "where":
            params = {"topic": args.topic} if args.topic else None
            url = f"{base}/v1/groups/{group}/keys/{_segment(args.key)}"
            return _request(args, "GET", url, params=params)
        case "rebalance":
            return _request(args, "POST", f"{base}/v1/groups/{group}/rebalance")
        case "fence":
            url = f"{base}/v1/groups/{group}/members/{_segment(args.member)}"
            return _request(args, "DELETE", url)
        case "reset-positions":
            url = f"{base}/v1/groups/{group}/positions/reset"
            return _request(args, "POST", url, body=reset_body(args))
    raise AdminError(f"unknown command {args.command!r}")


def reset_body(args: argparse.Namespace) -> dict[str, Any]:
    """The admin API's reset request for `reset-positions`' flags."""
    body: dict[str, Any] = {"execute": args.execute}
    if args.to_offset is not None:
        body.update(to="offset", offset=args.to_offset)
    elif args.to_datetime is not None:
        body.update(to="datetime", datetime=args.to_datetime)
    else:
        body["to"] = "earliest" if args.to_earliest else "latest" if args.to_latest else "committed"
    if args.topic is not None:
        topic, colon, partition = args.topic.rpartition(":")
        if colon and partition.isdigit():
            body.update(topic=topic, partition=int(partition))
        else:
            body["topic"] = args.topic
    if args.slots is not None:
        first, dash, last = args.slots.partition("-")
        if not (dash and first.isdigit() and last.isdigit()):
            raise AdminError(f"--slots {args.slots!r}: expected A-B, two slot numbers")
        body["slots"] = [int(first), int(last)]
    return body


def _segment(value: str) -> str:
    """One URL path segment: a key may contain '/', '?' or spaces."""
    return quote(value, safe="")


def _request(
    args: argparse.Namespace,
    method: str,
    url: str,
    params: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> Any:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        response = httpx.request(
            method, url, headers=headers, params=params, json=body, timeout=TIMEOUT_S
        )
    except httpx.ConnectError:
        raise AdminError(
            f"cannot reach the keyshard daemon at {args.admin} (is it running?)"
        ) from None
    except httpx.TimeoutException:
        raise AdminError(
            f"the keyshard daemon at {args.admin} did not answer in {TIMEOUT_S} s"
        ) from None
    except httpx.HTTPError as err:
        raise AdminError(f"request to {args.admin} failed: {err}") from None
    if response.status_code >= 400:
        raise AdminError(_describe_error(response, args))
    try:
        return response.json()
    except ValueError:
        raise AdminError(f"{args.admin} answered something that is not JSON") from None


def _describe_error(response: httpx.Response, args: argparse.Namespace) -> str:
    try:
        body = response.json()
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):  # request validation (422): each error's message
        detail = "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in detail)
    if not isinstance(detail, str):
        detail = json.dumps(detail) if detail else response.reason_phrase
    if response.status_code == 401:
        return f"authentication needed: {detail} (use --token or KEYSHARD_ADMIN_TOKEN)"
    if response.status_code == 403:
        return f"not allowed: {detail}"
    return f"{detail} (HTTP {response.status_code})"


def _ranges(pairs: list[list[int]]) -> str:
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in pairs)
    return text or "-"


def _show(args: argparse.Namespace, data: Any, console: Console) -> None:
    match args.command:
        case "groups":
            table = Table("group", "topics", "members", "owned slots", "unowned", "open handoffs")
            for g in data["groups"]:
                table.add_row(
                    g["group"],
                    ", ".join(g["topics"]),
                    str(g["members"]),
                    str(g["owned_slots"]),
                    str(g["unowned_slots"]),
                    str(g["open_handoffs"]),
                )
            console.print(table)
        case "status":
            _show_status(data["group"], data["handoffs"], console)
        case "positions":
            _show_positions(data, console)
        case "where":
            owner = data["owner"] or "nobody"
            state = "BLOCKED" if data["blocked"] else "running"
            console.print(f"key {data['key']!r} -> slot {data['slot']} -> {owner} ({state})")
            for p in data["positions"]:
                console.print(f"  {p['topic']}/{p['partition']}: next offset {p['next_offset']}")
        case "rebalance":
            console.print(f"group {data['group']}: target recomputed, {data['moved_slots']} moved")
        case "fence":
            console.print(f"member {data['member_id']} of group {data['group']} fenced")
        case "reset-positions":
            _show_reset(data, console)


def _show_positions(view: dict[str, Any], console: Console) -> None:
    """Where the group resumes: per topic-partition, each slot range and its next offset
    (offsets past it already done, `acked`, shown with it)."""
    table = Table("topic", "partition", "slots", "next offset", "acked", title=view["group"])
    for p in view["partitions"]:
        for s in p["segments"]:
            acked = ", ".join(f"{a}-{b - 1}" for a, b in s["acked"])
            table.add_row(
                p["topic"], str(p["partition"]), _ranges([[s["start"], s["end"]]]),
                str(s["next_offset"]), acked,
            )  # fmt: skip
    console.print(table)


def _show_reset(view: dict[str, Any], console: Console) -> None:
    """Before and after per topic-partition and slot range, as kafka-consumer-groups
    prints a reset; a dry run says how to apply it."""
    done = "reset" if view["executed"] else "dry run, nothing changed"
    table = Table(
        "topic", "partition", "slots", "next offset", "after reset",
        title=f"{view['group']}: to {view['to']} ({done})",
    )  # fmt: skip
    for m in view["moves"]:
        table.add_row(
            m["topic"], str(m["partition"]), _ranges([[m["start"], m["end"]]]),
            str(m["before"]), str(m["after"]),
        )  # fmt: skip
    console.print(table)
    if not view["executed"]:
        console.print("run again with --execute to apply it")


def _show_status(view: dict[str, Any], handoffs: dict[str, Any], console: Console) -> None:
    console.print(
        f"group [bold]{view['group']}[/bold]  topics {', '.join(view['topics'])}  "
        f"assignor {view['assignor']}  unowned {_ranges(view['unowned'])}"
    )
    table = Table()
    # Whole member ids on a narrow terminal too (`fence` takes one): the others shrink.
    longest = max((len(m["member_id"]) for m in view["members"]), default=6)
    table.add_column("member", no_wrap=True, min_width=longest)
    for name in (
        "principal",
        "epoch",
        "slots",
        "ranges",
        "processed",
        "rate/s",
        "speed/s",
        "draining",
    ):
        table.add_column(name)
    for m in view["members"]:
        rate = m.get("processed_per_s")
        speed = m.get("measured_speed")
        factor = m.get("speed_factor", 1.0)
        table.add_row(
            m["member_id"],
            m.get("principal", "-"),  # a coordinator before principals has none
            str(m["epoch"]),
            str(m["slots"]),
            _ranges(m["ranges"]),
            str(m["processed"]),
            "-" if rate is None else f"{rate:.1f}",
            "-" if speed is None else f"{speed:.0f}" + (f" x{factor:.2f}" if factor != 1 else ""),
            _ranges(m["draining"]["ranges"]) if m["draining"] else "",
        )
    console.print(table)
    shown = handoffs["handoffs"][:10]
    still_open = sum(1 for h in handoffs["handoffs"] if h["resumed_at"] is None)
    recent = Table(
        "#", "kind", "from", "to", "ranges", "pause",
        title=f"recent handoffs: {len(shown)} of {len(handoffs['handoffs'])}, "
        f"{still_open} open",
    )  # fmt: skip
    for h in shown:
        pause = "in progress" if h["pause_s"] is None else f"{h['pause_s'] * 1000:.1f} ms"
        recent.add_row(
            str(h["handoff_id"]),
            h["kind"],
            h["from_member"],
            ", ".join(h["to_members"]),
            _ranges(h["ranges"]),
            pause,
        )
    console.print(recent)
