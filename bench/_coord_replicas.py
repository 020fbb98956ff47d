"""Coordinator replicas for bench.coord_scale: start them, learn where each group is
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
from pathlib import Path

import httpx

from harness import CoordinatorProcess, ReplicaSet, is_settled, unsettled_reason

SERVED_BY = "x-keyshard-served-by"  # api/forward.py


async def start_replicas(
    bootstrap: str, replicas: int, log_dir: Path, extra: list[str]
) -> list[CoordinatorProcess]:
    """`replicas` coordinator processes r0, r1, ... on a fresh state topic, all ready
    (each logs under `log_dir/<replica id>/`)."""
    replica_set = ReplicaSet(bootstrap, log_dir, extra=extra)
    await replica_set.start(*(f"r{i}" for i in range(replicas)))
    return list(replica_set.replicas.values())


async def placed_groups(
    coords: list[CoordinatorProcess], groups: list[str], timeout: float = 90
) -> dict[str, CoordinatorProcess]:
    """Which replica serves each group, once every replica is ready and two answers a
    second apart agree (the replicas' own placement has settled)."""
    if len(coords) == 1:  # started ready, owning the state partitions: registers succeed
        return dict.fromkeys(groups, coords[0])
    by_id = {c.replica_id: c for c in coords}
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
    sizes: dict[str, int], owners: dict[str, CoordinatorProcess], per_process: int
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


async def groups_settled(owners: dict[str, CoordinatorProcess], sizes: dict[str, int]) -> list[str]:
    """The groups that are not settled as the replica serving each shows it (settled: all
    members, every slot running, nothing moving or pending), each with what it shows."""
    views = await asyncio.gather(*(owners[g].group(g, timeout=60) for g in sizes))
    return [
        f"{g}: {unsettled_reason(v)}"
        for g, v in zip(sizes, views, strict=True)
        if not is_settled(v, sizes[g])
    ]
