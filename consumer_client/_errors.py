"""The consumer's own error, apart so every module of the library can raise it."""

from __future__ import annotations


class ConsumerError(RuntimeError):
    """A condition the consumer cannot recover from by re-registering (bad config,
    unknown topic, wrong token, nothing reachable within `connect_timeout_ms`)."""
