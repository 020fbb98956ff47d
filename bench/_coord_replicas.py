"""Coordinator replicas for bench/coord_scale.py: start them, learn where each group is
served, split the simulated consumers over worker processes, check every group settled.

Replicas share a state topic of their own (one per run) and are started together; groups
are placed by the replicas themselves (a group lives in the state partition its name
hashes to, and the replicas share the partitions), so the benchmark only asks any replica
which one serves each group (the `x-keyshard-served-by` header of the admin API) and
connects the group's consumers there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench._coord_common import Coordinator, settled

SERVED_BY = "x-keyshard-served-by"  # api/forward.py


def start_replicas(
    bootstrap: str, replicas: int, log_dir: Path, stamp: str, extra: list[str]
) -> list[Coordinator]:
    """`replicas` coordinator processes r0, r1, ... on a fresh state topic, all ready."""
    state_topic = f"__keyshard_state.scale-{uuid.uuid4().hex[:8]}"
    coords = [
        Coordinator(
            bootstrap,
            log_dir / f"coordinator-{stamp}-r{i}.log",
            ["--state-topic", state_topic, "--replica-id", f"r{i}", *extra],
        )
        for i in range(replicas)
    ]
    for c in coords:
        c.launch()
    for c in coords:
        c.wait_ready()
    return coords


async def _ready(coord: Coordinator, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(f"{coord.admin_url}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the coordinator was not ready within {timeout:.0f} s")


async def placed_groups(
    coords: list[Coordinator], groups: list[str], timeout: float = 90
) -> dict[str, Coordinator]:
    """Which replica serves each group, once every replica is ready and two answers a
    second apart agree (the replicas' own placement has settled)."""
    if len(coords) == 1:  # ready once it owns the state partitions: registers succeed
        await _ready(coords[0], timeout)
        return dict.fromkeys(groups, coords[0])
    by_id = {f"r{i}": c for i, c in enumerate(coords)}
    previous: dict[str, str] | None = None
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline:
            ready = await asyncio.gather(
                *(client.get(f"{c.admin_url}/readyz") for c in coords), return_exceptions=True
            )
            answers = await asyncio.gather(
                *(client.get(f"{coords[0].admin_url}/v1/groups/{g}") for g in groups),
                return_exceptions=True,
            )
            current = {
                g: a.headers.get(SERVED_BY, "")
                for g, a in zip(groups, answers, strict=True)
                if isinstance(a, httpx.Response)
            }
            all_ready = all(isinstance(r, httpx.Response) and r.status_code == 200 for r in ready)
            placed = len(current) == len(groups) and all(v in by_id for v in current.values())
            if all_ready and placed and current == previous:
                return {g: by_id[r] for g, r in current.items()}
            previous = current
            await asyncio.sleep(1.0)
    raise RuntimeError(f"groups not placed on the replicas within {timeout:.0f} s")


def worker_plans(
    sizes: dict[str, int], owners: dict[str, Coordinator], per_process: int
) -> list[list[tuple[str, str, int]]]:
    """The simulated consumers, `per_process` to a worker process: per process a list of
    (group, address of the replica serving it, clients)."""
    plans: list[list[tuple[str, str, int]]] = []
    current: list[tuple[str, str, int]] = []
    room = per_process
    for group, size in sizes.items():
        left = size
        while left:
            take = min(left, room)
            current.append((group, owners[group].address, take))
            left -= take
            room -= take
            if room == 0:
                plans.append(current)
                current, room = [], per_process
    if current:
        plans.append(current)
    return plans


async def groups_settled(owners: dict[str, Coordinator], sizes: dict[str, int]) -> list[str]:
    """The groups that are not settled as the replica serving each shows it (settled: all
    members, every slot running, nothing moving or pending), each with what it shows."""
    async with httpx.AsyncClient(timeout=60) as client:

        async def view(group: str) -> Any:
            response = await client.get(f"{owners[group].admin_url}/v1/groups/{group}")
            return response.json() if response.status_code == 200 else None

        views = await asyncio.gather(*(view(g) for g in sizes))
    return [
        f"{g}: {_summary(v)}" for g, v in zip(sizes, views, strict=True) if not settled(v, sizes[g])
    ]


def _summary(view: Any) -> str:
    if view is None:
        return "no view"
    members = view["members"]
    return (
        f"{len(members)} members, unowned {view['unowned']}, target_pending "
        f"{view['target_pending']}, quarantined {view['quarantined']}, draining "
        f"{sum(1 for m in members if m['draining'])}, starting "
        f"{sum(1 for m in members if m['starting'])}"
    )
