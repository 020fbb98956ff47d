"""Sessionization rules: the plain-Python reference, and the Spark functions against it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from keyshard.spark_jobs.clickstream import BAD_VALUES, events
from keyshard.spark_jobs.sessionize import (
    Click,
    Session,
    classify_clicks,
    parse_click,
    reference_sessions,
    sessionize,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RAW_SCHEMA = "key binary, value binary, topic string, partition int, offset long"
GAP = 30 * 60_000


def _click(ts: int, page: str = "/", action: str = "view", user: str = "u") -> Click:
    return Click(user, ts, page, action, "t", 0, ts)


def test_a_gap_of_exactly_the_limit_stays_in_the_session() -> None:
    sessions = reference_sessions([_click(0), _click(GAP), _click(2 * GAP + 1)], GAP)
    assert [(s.start_ms, s.end_ms, s.events) for s in sessions] == [
        (0, GAP, 2),
        (2 * GAP + 1,) * 2 + (1,),
    ]


def test_event_time_not_arrival_order_decides() -> None:
    late = [_click(10_000, "/b"), _click(0, "/a", "purchase"), _click(20_000, "/a")]
    (session,) = reference_sessions(late, GAP)
    assert session == Session(
        user="u", session_id="u:0", start_ms=0, end_ms=20_000, duration_s=20.0, events=3,
        distinct_pages=2, pages=("/a", "/b", "/a"), entry_page="/a", exit_page="/a", purchases=1,
    )  # fmt: skip


EDGE_VALUES: list[tuple[bytes | None, bytes | None]] = [
    (b"u", b'{"ts": 5, "page": "/a", "action": "view"}'),
    (b"u", b'  {"ts": -5, "page": "", "action": "x", "extra": [1, {"y": null}]}'),
    (b"u", b'{"ts": 5, "page": "/a", "action": "view"} trailing text'),
    (b"u", b'{"ts": 9223372036854775807, "page": "/a", "action": "v"}'),
    (b"u", b'{"ts": 9223372036854775808, "page": "/a", "action": "v"}'),
    (b"u", b'{"ts": 5, "page": "/a", "action": "v", "x": NaN}'),
    (b"u", b'{"ts": 5, "ts": 6, "page": "/a", "action": "v"}'),
    (b"u", b'{"ts": true, "page": "/a", "action": "v"}'),
    (b"u", b'{"ts": 1e3, "page": "/a", "action": "v"}'),
    (b"u", b'{"ts": null, "page": "/a", "action": "v"}'),
    (b"u", b'{"ts": 5, "page": {"p": 1}, "action": "v"}'),
    (b"u", b"null"),
    (b"u", None),
    (None, b'{"ts": 5, "page": "/a", "action": "view"}'),
    (b"", b'{"ts": 5, "page": "/a", "action": "view"}'),
    *((b"u", bad) for bad in BAD_VALUES),
]


def _raw(spark: SparkSession, rows: list[tuple[bytes | None, bytes | None]]) -> DataFrame:
    return spark.createDataFrame([(k, v, "t", 0, i) for i, (k, v) in enumerate(rows)], RAW_SCHEMA)


def test_spark_accepts_and_rejects_exactly_what_the_reference_does(spark: SparkSession) -> None:
    got = {
        r["offset"]: (r["user"], r["ts"], r["page"], r["action"]) if r["ok"] else None
        for r in classify_clicks(_raw(spark, EDGE_VALUES)).collect()
    }
    for i, (key, value) in enumerate(EDGE_VALUES):
        click = parse_click(key, value, "t", 0, i)
        expected = None if click is None else (click.user, click.ts, click.page, click.action)
        assert got[i] == expected, (key, value)
    assert sum(v is None for v in got.values()) >= len(BAD_VALUES) + 8


def _as_rows(sessions: list[Session]) -> list[dict[str, Any]]:
    return [
        {**{f: getattr(s, f) for f in Session.__slots__}, "pages": list(s.pages)} for s in sessions
    ]


def session_rows(df: DataFrame) -> list[dict[str, Any]]:
    """Spark's session rows in the reference's shape (epoch ms instead of timestamps)."""
    fields = list(Session.__slots__)
    rows = [r.asDict() for r in df.select(*fields).collect()]
    return sorted(rows, key=lambda r: (r["user"], r["start_ms"]))


def test_spark_sessions_equal_the_reference(spark: SparkSession) -> None:
    records = events(users=30, count=1500, seed=3, bad=20)
    raw = _raw(spark, [(r.key, r.value) for r in records])
    clicks = classify_clicks(raw).where("ok")
    got = session_rows(sessionize(clicks, GAP))
    expected = reference_sessions(
        (c for i, r in enumerate(records) if (c := parse_click(r.key, r.value, "t", 0, i))), GAP
    )
    assert len(expected) > 30  # the generator makes several sessions per user
    assert got == _as_rows(expected)


def test_the_generator_is_deterministic() -> None:
    a, b, c = events(10, 200, seed=1, bad=5), events(10, 200, seed=1, bad=5), events(10, 200, 2)
    assert a == b and a != c
    assert len(a) == 205
    assert sum(parse_click(r.key, r.value) is None for r in a) == 5
    assert all(json.loads(r.value)["ts"] > 0 for r in c)


@pytest.mark.parametrize(("users", "count", "bad"), [(0, 1, 0), (1, -1, 0), (1, 1, -2)])
def test_generator_bad_sizes(users: int, count: int, bad: int) -> None:
    with pytest.raises(ValueError, match="must be >= "):
        events(users, count, seed=1, bad=bad)
