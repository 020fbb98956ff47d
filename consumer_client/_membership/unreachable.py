"""Telling a user that the coordinator or Kafka cannot be reached: loudly, not often.

A consumer retrying in silence looks like a hang, and a plain app configures no logging:
so the first failure is a WARNING (Python prints warnings to stderr even with no logging
configured) naming the addresses tried and the error, and while the failures go on one
more WARNING at most every `interval_s`, saying for how long. `connect_timeout_ms` turns
"for how long" into a `ConsumerError` for apps that prefer to fail (None, the default:
retry forever, as a Kubernetes pod waiting for its coordinator should).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from keyshard.consumer_client._errors import ConsumerError

#: While failures go on, one WARNING at most this often.
REPEAT_INTERVAL_S = 30.0


class Unreachable:
    """Failures in a row to reach `what` ("the coordinator", "Kafka"): logs them and
    enforces `connect_timeout_ms`."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        connect_timeout_ms: int | None = None,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if connect_timeout_ms is not None and connect_timeout_ms <= 0:
            raise ValueError(f"connect_timeout_ms={connect_timeout_ms} must be > 0 (None: forever)")
        self._log = logger
        self._what = what
        self._timeout = None if connect_timeout_ms is None else connect_timeout_ms / 1000
        self._interval = interval_s
        self._clock = clock
        self._since: float | None = None  # the first failure of the current run of them
        self._next_warning = 0.0
        self._failures = 0

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, addresses: str, error: object) -> None:
        """One more failure: a WARNING when it is the first or the interval has passed;
        `ConsumerError` once failures have lasted `connect_timeout_ms`."""
        now = self._clock()
        if self._since is None:
            self._since = now
            self._failures = 0
        self._failures += 1
        elapsed = now - self._since
        if self._timeout is not None and elapsed >= self._timeout:
            raise ConsumerError(
                f"cannot reach {self._what} at {addresses} within the connect timeout "
                f"({self._timeout:g} s): {error}"
            )
        if now >= self._next_warning:
            self._next_warning = now + self._interval
            if self._failures == 1:
                self._log.warning(
                    "cannot reach %s at %s: %s (retrying%s)", self._what, addresses, error,
                    "" if self._timeout is None else f" for up to {self._timeout:g} s",
                )  # fmt: skip
            else:
                self._log.warning(
                    "still cannot reach %s at %s after %.0f s (%d attempts): %s",
                    self._what, addresses, elapsed, self._failures, error,
                )  # fmt: skip
        else:
            self._log.debug("cannot reach %s at %s: %s", self._what, addresses, error)

    def succeeded(self) -> None:
        if self._since is not None and self._failures > 1:
            self._log.info(
                "reached %s after %.1f s of failures", self._what, self._clock() - self._since
            )
        self._since = None
        self._next_warning = 0.0
