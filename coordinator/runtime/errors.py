"""The one error the runtime answers a consumer's request with."""

from __future__ import annotations

from keyshard.core.protocol.messages import ErrorCode


class CoordinatorError(Exception):
    """A request refused: the wire's error code and a message safe to send and log."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
