"""What a peer can put in the logs, and how much of it.

Two things a client, or anyone who can write to a socket or a topic, controls about a
log line:

* **Its text.** Names a client chooses (a consumer name, a member id, a group) end up in
  log lines. A newline in one forges a line of its own ("... INFO member x joined\\n...
  WARNING coordinator shutting down"); an escape sequence rewrites a terminal. `printable`
  renders such a value escaped and cut to a length; `PrintableMessages`, a filter on the
  daemon's log handlers, escapes every record's message as a last line of defence.
* **Its rate.** A flood repeats one event thousands of times a second; one line per event
  grows the log by 60 MB in 6 s. `ThrottledLog` logs a few lines per interval, per peer
  and in all, and one more line with the count of the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

#: Characters of a peer's value a log line shows; the rest is counted ("...(+80 chars)").
MAX_SHOWN = 120


def printable(value: object, limit: int = MAX_SHOWN) -> str:
    """`value` as text that stays on its line: every character that is not printable
    (controls, line and paragraph separators, format characters) as its escape (`\\n`,
    `\\x1b`, `\\u2028`), cut after `limit` characters with the count of the rest."""
    text = str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"{text}...(+{cut} chars)" if cut > 0 else text


class PrintableMessages(logging.Filter):
    """A handler filter: a record whose message would span lines, or carry terminal
    escapes, is logged with them escaped (`printable`, not cut). Tracebacks are the
    formatter's, after the message, and stay as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.isprintable():
            record.msg = printable(message, limit=len(message))
            record.args = None
        return True


class ThrottledLog:
    """At most `burst` lines per `interval_s` (and with `per_peer`, at most that many for
    one peer); the events past that are counted and told in one line when the interval
    ends ("... and 917 more bad frames from 12 addresses in the last 10 s").

    The per-peer limit keeps one noisy client from using up the burst, so the lines that
    do appear name different peers. The summary comes from a loop timer, so the last
    burst of a flood is reported even if nothing follows it.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        interval_s: float = 10.0,
        burst: int = 3,
        per_peer: int | None = None,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._what = what
        self._interval_s = interval_s
        self._burst = burst
        self._per_peer = per_peer
        self._level = level
        self._clock = clock
        self._window_end = 0.0
        self._logged = 0
        self._suppressed = 0
        self._peers: Counter[str] = Counter()  # events per peer in this interval
        self._suppressed_peers: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, message: str, *args: object) -> None:
        self._event(None, message, args)

    def from_peer(self, peer: str, message: str, *args: object) -> None:
        """An event caused by `peer` (its address): counted against its own limit too."""
        self._event(peer, message, args)

    def _event(self, peer: str | None, message: str, args: tuple[object, ...]) -> None:
        now = self._clock()
        if now >= self._window_end:
            self.flush()
            self._window_end = now + self._interval_s
            self._logged = 0
            self._peers.clear()
        within = self._logged < self._burst
        if peer is not None:
            self._peers[peer] += 1
            within = within and (self._per_peer is None or self._peers[peer] <= self._per_peer)
        if within:
            self._logged += 1
            self._logger.log(self._level, message, *args)
            return
        self._suppressed += 1
        if peer is not None:
            self._suppressed_peers.add(peer)
        if self._timer is None:
            with_loop = _running_loop()
            if with_loop is not None:
                self._timer = with_loop.call_later(max(0.0, self._window_end - now), self.flush)

    def flush(self) -> None:
        """Say how many events were not logged, if any (at the window's end, and on close)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._suppressed:
            peers = len(self._suppressed_peers)
            source = f" from {peers} address{'es' if peers > 1 else ''}" if peers else ""
            self._logger.log(
                self._level,
                "... and %d more %s%s in the last %g s",
                self._suppressed,
                self._what,
                source,
                self._interval_s,
            )
            self._suppressed = 0
            self._suppressed_peers.clear()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
