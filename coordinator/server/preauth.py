"""What a connection gets from the coordinator before its Register succeeds: almost
nothing.

Validating a message costs far more than parsing its JSON (a 1 MiB Register held the
event loop for ~280 ms), and until the peer has shown the token nothing it sends deserves
that. So each frame of an unregistered connection is parsed and screened here before it
is validated (`keyshard.core.protocol.codec.Screen`):

* a `register_request` must carry credentials its connection's `Authentication` accepts
  (the shared `--auth-token` or a static per-principal token, compared in constant time;
  a JWT is verified later), before anything else in it is looked at: a wrong or missing
  one is `AUTHENTICATION_FAILED` at the cost of a JSON parse;
* a message only the coordinator sends, or a consumer sends only as a member (a reply to
  a Ping, a StopFetcher, a StartFetcher), is `UNEXPECTED_MESSAGE` at the same cost;
* a `metadata_request`, a `leave_request` and anything unknown go on to validation,
  which refuses the bad ones with its precise error (the session refuses a Leave from a
  connection that is not a member).

The frame limit that comes with it (`ConnectionLimits.pre_auth_max_frame_bytes`) bounds
the rest: what one unauthenticated connection can make the coordinator buffer or validate.
The lines bad input produces are counted per peer (`bad_input_reporter`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from keyshard.core.protocol.channel import BadInputReporter, Channel
from keyshard.core.protocol.codec import (
    ForeignProtocol,
    ProtocolError,
    Screen,
    correlation_id_of,
)
from keyshard.core.protocol.messages import RESPONSE_TYPES, ErrorCode
from keyshard.core.security.log_safety import ThrottledLog

# What a consumer may send before it is a member; every other known message type is
# refused unread. (Responses are a member's answers; the other requests are the
# coordinator's own.)
_BEFORE_REGISTER = {"metadata_request", "register_request", "leave_request"}
# (An error_response is a peer closing on us, as from a member: the channel closes.)
_MEMBERS_ONLY = {
    "ping_request", "stop_fetcher_request", "start_fetcher_request",
    *(cls.model_fields["type"].default for cls in RESPONSE_TYPES),
} - {"error_response"}  # fmt: skip


#: Why a Register's `auth_token` (any JSON value, or None when absent) is refused, or None.
TokenCheck = Callable[[object], str | None]


def register_screen(token_check: TokenCheck | None) -> Screen:
    """The screen of an unregistered connection whose Register's token `token_check`
    judges (None: no credentials are checked here, only the message types)."""

    def screen(document: Any) -> None:
        if not isinstance(document, dict):
            return  # not a JSON object: validation refuses it at once
        kind = document.get("type")
        if not isinstance(kind, str) or kind in _BEFORE_REGISTER - {"register_request"}:
            return
        if kind in _MEMBERS_ONLY:
            raise ProtocolError(
                ErrorCode.UNEXPECTED_MESSAGE,
                f"a consumer may not send {kind} (this connection has not registered)",
                correlation_id=correlation_id_of(document),
            )
        if kind != "register_request" or token_check is None:
            return
        refusal = token_check(document.get("auth_token"))
        if refusal is not None:
            raise ProtocolError(
                ErrorCode.AUTHENTICATION_FAILED,
                refusal,
                correlation_id=correlation_id_of(document),
            )

    return screen


def bad_input_reporter(logger: logging.Logger) -> tuple[BadInputReporter, ThrottledLog]:
    """A channel's bad-input reporter for the coordinator's side: one line per peer and at
    most five in all per 10 s, then a count (`ThrottledLog`). Returns the log too, to
    flush on close. An HTTP response is a peer we connected to, never one of these."""
    throttled = ThrottledLog(logger, "bad frames", burst=5, per_peer=1)

    def report(channel: Channel, err: ProtocolError, foreign: ForeignProtocol | None) -> None:
        hint = "" if foreign is None else f" ({foreign.value})"
        throttled.from_peer(
            channel.peer_host, "bad input from %s: %s%s", channel.peer, err.message, hint
        )

    return report, throttled
