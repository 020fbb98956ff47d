"""Clickstream sessionization, twice: as Spark DataFrame functions and as plain Python.

The rules (both implementations):
- A record is a click when its key (the user id) is present and its value is a JSON
  object with an integer `ts` (epoch ms, 64-bit), a string `page` and a string `action`.
  Anything else is rejected, not fatal. As with Spark's JSON reader, text after the
  first JSON value is ignored, and an object with a duplicate field is rejected.
- A user's clicks are ordered by event time (`ts`, ties by topic, partition, offset); a
  session ends when the next click is more than `gap_ms` later.
- A session row: user, session_id (`user:start_ms`), start/end (UTC timestamps, plus the
  epoch-ms values), duration_s, events, distinct_pages, pages (in order), entry/exit page,
  purchases (clicks with action "purchase").

`reference_sessions` is the plain-Python statement of these rules that the pipeline's
output is tested against.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEFAULT_GAP_MS = 30 * 60_000
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_JSON_WHITESPACE = " \t\n\r"


@dataclass(frozen=True, slots=True)
class Click:
    user: str
    ts: int
    page: str
    action: str
    topic: str = ""
    partition: int = 0
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    user: str
    session_id: str
    start_ms: int
    end_ms: int
    duration_s: float
    events: int
    distinct_pages: int
    pages: tuple[str, ...]
    entry_page: str
    exit_page: str
    purchases: int


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate field")
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python accepts NaN/Infinity; JSON (and Spark) not


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants)


def parse_click(
    key: bytes | None, value: bytes | None, topic: str = "", partition: int = 0, offset: int = 0
) -> Click | None:
    """The click in a record, or None when the record is rejected (see the module rules)."""
    if key is None or value is None:
        return None
    text = value.decode("utf-8", errors="replace").lstrip(_JSON_WHITESPACE)
    try:
        obj, _ = _DECODER.raw_decode(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    ts, page, action = obj.get("ts"), obj.get("page"), obj.get("action")
    if type(ts) is not int or not _LONG_MIN <= ts <= _LONG_MAX:
        return None
    if type(page) is not str or type(action) is not str:
        return None
    return Click(key.decode("utf-8", errors="replace"), ts, page, action, topic, partition, offset)


def _session(user: str, clicks: list[Click]) -> Session:
    pages = tuple(c.page for c in clicks)
    start, end = clicks[0].ts, clicks[-1].ts
    return Session(
        user=user,
        session_id=f"{user}:{start}",
        start_ms=start,
        end_ms=end,
        duration_s=(end - start) / 1000.0,
        events=len(clicks),
        distinct_pages=len(set(pages)),
        pages=pages,
        entry_page=pages[0],
        exit_page=pages[-1],
        purchases=sum(1 for c in clicks if c.action == "purchase"),
    )


def reference_sessions(clicks: Iterable[Click], gap_ms: int = DEFAULT_GAP_MS) -> list[Session]:
    """Sessions of `clicks`, sorted by (user, start)."""
    by_user: dict[str, list[Click]] = defaultdict(list)
    for click in clicks:
        by_user[click.user].append(click)
    out = []
    for user, user_clicks in by_user.items():
        user_clicks.sort(key=lambda c: (c.ts, c.topic, c.partition, c.offset))
        current = [user_clicks[0]]
        for click in user_clicks[1:]:
            if click.ts - current[-1].ts > gap_ms:
                out.append(_session(user, current))
                current = []
            current.append(click)
        out.append(_session(user, current))
    return sorted(out, key=lambda s: (s.user, s.start_ms))


# ---- the same rules on Spark DataFrames ---------------------------------------------------


def classify_clicks(records: DataFrame) -> DataFrame:
    """Records (key, value binary; topic, partition, offset) → the same rows plus `user`,
    `ts`, `page`, `action` and `ok` (false: rejected). Pure column expressions, no UDF."""
    from pyspark.sql import functions as F

    v = F.try_parse_json(F.col("value").cast("string"))

    def kind(path: str) -> Any:
        return F.schema_of_variant(F.variant_get(v, path, "variant"))

    ok = (
        F.col("key").isNotNull()
        & F.coalesce(F.schema_of_variant(v).startswith("OBJECT<"), F.lit(False))
        & F.coalesce(kind("$.ts") == "BIGINT", F.lit(False))
        & F.coalesce(kind("$.page") == "STRING", F.lit(False))
        & F.coalesce(kind("$.action") == "STRING", F.lit(False))
    )
    return records.select(
        "*",
        F.col("key").cast("string").alias("user"),
        F.try_variant_get(v, "$.ts", "bigint").alias("ts"),
        F.try_variant_get(v, "$.page", "string").alias("page"),
        F.try_variant_get(v, "$.action", "string").alias("action"),
        ok.alias("ok"),
    )


def sessionize(clicks: DataFrame, gap_ms: int = DEFAULT_GAP_MS) -> DataFrame:
    """Clicks (user, ts, page, action, topic, partition, offset) → one row per session."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = ["ts", "topic", "partition", "offset"]
    by_time = Window.partitionBy("user").orderBy(*order)
    marked = clicks.withColumn(
        "starts",
        F.when(
            F.lag("ts").over(by_time).isNull() | (F.col("ts") - F.lag("ts").over(by_time) > gap_ms),
            1,
        ).otherwise(0),
    ).withColumn(
        "session_no",
        F.sum("starts").over(by_time.rowsBetween(Window.unboundedPreceding, Window.currentRow)),
    )
    grouped = marked.groupBy("user", "session_no").agg(
        F.min("ts").alias("start_ms"),
        F.max("ts").alias("end_ms"),
        F.count(F.lit(1)).alias("events"),
        F.count_distinct("page").alias("distinct_pages"),
        F.sum(F.when(F.col("action") == "purchase", 1).otherwise(0)).alias("purchases"),
        F.array_sort(F.collect_list(F.struct(*order, "page"))).alias("steps"),
    )
    pages = F.transform("steps", lambda s: s["page"])
    return grouped.select(
        "user",
        F.concat_ws(":", "user", F.col("start_ms").cast("string")).alias("session_id"),
        F.timestamp_millis("start_ms").alias("session_start"),
        F.timestamp_millis("end_ms").alias("session_end"),
        "start_ms",
        "end_ms",
        ((F.col("end_ms") - F.col("start_ms")) / 1000.0).alias("duration_s"),
        "events",
        F.col("distinct_pages").cast("int").alias("distinct_pages"),
        pages.alias("pages"),
        pages[0].alias("entry_page"),
        F.element_at(pages, -1).alias("exit_page"),
        F.col("purchases").cast("long").alias("purchases"),
    )
