"""What a peer can put in a log line: escaped and cut (`printable`, `PrintableMessages`),
and how many lines (`ThrottledLog` per peer and in all)."""

from __future__ import annotations

import logging

import pytest

from keyshard.core.security.log_safety import PrintableMessages, ThrottledLog, printable


def test_a_name_with_control_characters_stays_on_its_line() -> None:
    forged = "c0\n2026-01-01 INFO keyshard: coordinator stopped\x1b[2J\u2028"
    shown = printable(forged)
    assert "\n" not in shown and "\x1b" not in shown and "\u2028" not in shown
    assert shown == "c0\\n2026-01-01 INFO keyshard: coordinator stopped\\x1b[2J\\u2028"
    assert printable("worker-1 é ✓") == "worker-1 é ✓"  # printable text is left alone


def test_a_long_name_is_cut_with_the_count_of_the_rest() -> None:
    assert printable("x" * 300, limit=10) == "xxxxxxxxxx...(+290 chars)"
    assert printable("\n" * 20, limit=2) == "\\n\\n...(+18 chars)"


def test_the_filter_escapes_what_any_logger_formats(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("t.printable")
    caplog.handler.addFilter(PrintableMessages())
    try:
        with caplog.at_level(logging.INFO, logger="t.printable"):
            logger.info("member %s joined", "evil\nWARNING forged line")
            logger.info("plain %d", 7)
    finally:
        caplog.handler.removeFilter(caplog.handler.filters[-1])
    assert [r.getMessage() for r in caplog.records] == [
        "member evil\\nWARNING forged line joined",
        "plain 7",
    ]
    assert "forged line joined" in caplog.text and "\nWARNING forged" not in caplog.text


def test_one_noisy_peer_does_not_use_up_the_lines(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    throttled = ThrottledLog(
        logging.getLogger("t.peers"), "bad frames", burst=3, per_peer=1, clock=lambda: now[0]
    )
    with caplog.at_level(logging.WARNING, logger="t.peers"):
        for i in range(100):
            throttled.from_peer("10.0.0.1", "bad frame %d from 10.0.0.1", i)
        throttled.from_peer("10.0.0.2", "bad frame from 10.0.0.2")
        throttled.from_peer("10.0.0.3", "bad frame from 10.0.0.3")
        throttled.from_peer("10.0.0.4", "bad frame from 10.0.0.4")  # past the burst
        now[0] = 10.0  # the interval ends: its count, then a fresh one
        throttled.from_peer("10.0.0.1", "bad frame again")
        throttled.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "bad frame 0 from 10.0.0.1",
        "bad frame from 10.0.0.2",
        "bad frame from 10.0.0.3",
        "... and 100 more bad frames from 2 addresses in the last 10 s",
        "bad frame again",
    ]
