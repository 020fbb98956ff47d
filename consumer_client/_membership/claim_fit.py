"""A Register within what a coordinator takes before authentication.

Until its Register succeeds a connection may send frames of at most
`PRE_AUTH_MAX_FRAME_BYTES` (64 KiB; docs/protocol.md §3.3). A new member's Register is a
few hundred bytes; a claim (§7.4) carries the positions of every range the member still
runs, which for many partitions with many offsets acked out of order can be more. Such a
claim is sent with less in it rather than refused: first without the acked offsets above
each position, then without positions at all. Positions only say which offsets are done,
so a claim that says less costs duplicates at most, never a record: the new owner keeps
the positions it stored, and the member reports its own at the next Ping.
"""

from __future__ import annotations

from keyshard.core.protocol.codec import PRE_AUTH_MAX_FRAME_BYTES, encode
from keyshard.core.protocol.messages import (
    PartitionPositions,
    PositionModel,
    RangePosition,
    RegisterRequest,
)


def fit_before_authentication(
    request: RegisterRequest, limit: int = PRE_AUTH_MAX_FRAME_BYTES
) -> RegisterRequest:
    """`request` as it can be sent before authentication: itself when it fits `limit`,
    else with its claim's positions thinned (see the module docstring). A Register that
    does not fit even then is returned as it is, for the coordinator to refuse."""
    claim = request.claim
    if claim is None or _fits(request, limit):
        return request
    for positions in (_without_acked(claim.positions), []):
        thinner = request.model_copy(
            update={"claim": claim.model_copy(update={"positions": positions})}
        )
        if _fits(thinner, limit):
            return thinner
    return request


def _fits(request: RegisterRequest, limit: int) -> bool:
    return len(encode(request)) - 4 <= limit  # the limit counts what follows the length


def _without_acked(positions: list[PartitionPositions]) -> list[PartitionPositions]:
    return [
        p.model_copy(
            update={
                "ranges": [
                    RangePosition(
                        range=r.range, position=PositionModel(next_offset=r.position.next_offset)
                    )
                    for r in p.ranges
                ]
            }
        )
        for p in positions
    ]
