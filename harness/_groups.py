"""Reading a group view of the admin API (`GET /v1/groups/{group}`): who owns which slots,
and whether the group has settled."""

from __future__ import annotations

from typing import Any

from keyshard.core.model.ranges import RangeSet


def owned_ranges(view: dict[str, Any]) -> dict[str, RangeSet]:
    """The slots each member owns, by member id."""
    return {m["member_id"]: RangeSet.from_pairs(m["ranges"]) for m in view["members"]}


def is_settled(view: dict[str, Any] | None, members: int) -> bool:
    """Exactly `members` members, every slot owned, nothing draining or starting, and no
    recompute pending (a join the coordinator has not placed yet moves slots soon)."""
    if view is None or len(view["members"]) != members:
        return False
    if view["quarantined"] or view["unowned"] or view["target_pending"]:
        return False
    return all(not m["draining"] and not m["starting"] for m in view["members"])


def unsettled_reason(view: dict[str, Any] | None) -> str:
    """What a view shows against being settled, in one line, for a failure message."""
    if view is None:
        return "no view"
    members = view["members"]
    return (
        f"{len(members)} members, unowned {view['unowned']}, target_pending "
        f"{view['target_pending']}, quarantined {view['quarantined']}, draining "
        f"{sum(1 for m in members if m['draining'])}, starting "
        f"{sum(1 for m in members if m['starting'])}"
    )
