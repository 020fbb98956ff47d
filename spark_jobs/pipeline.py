"""The clickstream sessionization job: Kafka (through the keyshard batch read) → Parquet.

    spark-submit spark_jobs/pipeline.py --bootstrap-servers kafka:9092 --topic clicks \\
        --output /data/sessions [--rejects /data/rejects] [--ranges 16] [--gap-minutes 30]
    python -m keyshard.spark_jobs.pipeline ...   # same, on a local session (--master to change)

It reads every record of the topic(s) up to the high watermark at start, through the
`keyshard` format with `--ranges` slot ranges per partition: each Spark partition is one
(topic-partition x slot range) and holds every record of its keys, in offset order, so the
read runs with `partitions x ranges` tasks instead of Spark's Kafka source's one per
partition — key-ordered parallelism beyond the partition count. Malformed records are
counted and skipped (written to `--rejects` when given), never fatal. Rules:
`spark_jobs.sessionize`. Prints one JSON line with the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from keyshard.spark_jobs.launch import job_session
from keyshard.spark_jobs.sessionize import DEFAULT_GAP_MS, classify_clicks, sessionize

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from keyshard.spark_jobs.kafka_io import SparkKafka

WRITE_MODES = ("errorifexists", "overwrite")


class NothingRead(RuntimeError):
    """The topics hold records but the read returned none: never an empty success."""


@dataclass(frozen=True, slots=True)
class PipelineResult:
    records: int
    clicks: int
    rejected: int
    sessions: int
    read_partitions: int
    output: str


def read_records(
    spark: SparkSession, kafka: SparkKafka, topics: list[str], ranges: int
) -> DataFrame:
    from keyshard.spark_jobs.source import register

    register(spark)
    return (
        spark.read.format("keyshard")
        .options(**kafka.as_options())
        .option("topics", ",".join(topics))
        .option("ranges", str(ranges))
        .load()
    )


def run_pipeline(
    spark: SparkSession,
    *,
    bootstrap_servers: str,
    topics: list[str],
    output: str,
    rejects: str | None = None,
    ranges: int = 8,
    gap_ms: int = DEFAULT_GAP_MS,
    mode: str = "errorifexists",
    kafka_config: Mapping[str, str] | None = None,
) -> PipelineResult:
    """Sessionize `topics` into Parquet at `output`; rejected records to `rejects` if given.
    `kafka_config`: Kafka client settings in Kafka's names (security, SASL, TLS)."""
    if mode not in WRITE_MODES:
        raise ValueError(f"mode must be one of {WRITE_MODES}, got {mode!r}")
    if gap_ms <= 0:
        raise ValueError(f"the session gap must be > 0, got {gap_ms} ms")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    from keyshard.spark_jobs.kafka_io import SparkKafka

    kafka = SparkKafka(bootstrap_servers, dict(kafka_config or {}))
    promised = count_offsets(kafka, topics)
    raw = read_records(spark, kafka, topics, ranges)
    # One read of Kafka: everything after this works from the cached, classified records
    # (a second read would plan again, against a newer high watermark).
    checked = classify_clicks(raw).persist()
    try:
        records = checked.count()
        if records == 0 and promised > 0:
            # Fewer records than offsets is normal (transaction markers, compaction);
            # none at all from partitions that hold some is a broken read, not a quiet day.
            raise NothingRead(
                f"read 0 records of {topics} from {bootstrap_servers}, whose partitions "
                f"hold {promised} offsets between their low and high watermarks"
            )
        partitions = checked.rdd.getNumPartitions()
        clicks = checked.where("ok").select(
            "user", "ts", "page", "action", "topic", "partition", "offset"
        )
        sessionize(clicks, gap_ms).write.mode(mode).parquet(output)
        bad = checked.where("NOT ok")
        rejected = bad.count()
        if rejects is not None:
            bad.selectExpr(
                "topic", "partition", "offset", "CAST(key AS STRING) AS key",
                "CAST(value AS STRING) AS value", "timestamp",
            ).write.mode(mode).parquet(rejects)  # fmt: skip
    finally:
        checked.unpersist()
    sessions = spark.read.parquet(output).count()
    return PipelineResult(records, records - rejected, rejected, sessions, partitions, output)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="keyshard.spark_jobs.pipeline",
        description="Sessionize a clickstream topic (key = user id) into Parquet.",
    )
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--topic", required=True, help="topic, or comma-separated topics")
    p.add_argument("--output", required=True, help="Parquet directory of sessions")
    p.add_argument("--rejects", default=None, help="Parquet directory of malformed records")
    p.add_argument("--ranges", type=int, default=8, help="slot ranges per partition (1..65536)")
    p.add_argument("--gap-minutes", type=float, default=DEFAULT_GAP_MS / 60_000)
    p.add_argument("--mode", choices=WRITE_MODES, default="errorifexists")
    p.add_argument("--master", default=None, help="default: spark-submit's, else local[2]")
    p.add_argument(
        "--kafka-config", default=None,
        help="Kafka client settings, Java .properties format (security.protocol, sasl.*, ssl.*)",
    )  # fmt: skip
    return p


def count_offsets(kafka: SparkKafka, topics: list[str]) -> int:
    """Offsets between the low and high watermarks of every partition of `topics`; fails
    (SourceError) when Kafka or a topic is not there, before any JVM starts."""
    from keyshard.spark_jobs.kafka_io import read_watermarks

    # In a thread of its own: the caller may be inside an event loop (a notebook, a test).
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(asyncio.run, read_watermarks(kafka, topics, timeout=10))
        marks = job.result()
    return sum(high - low for low, high in marks.values())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    topics = [t.strip() for t in args.topic.split(",")]
    if not all(topics):
        parser.error(f"--topic {args.topic!r} has an empty topic name")
    if not 1 <= args.ranges <= 65536:
        parser.error(f"--ranges {args.ranges} is outside 1..65536")
    if not args.gap_minutes > 0:
        parser.error(f"--gap-minutes must be > 0, got {args.gap_minutes}")
    from keyshard.core.kafka.settings import KafkaConfigError, load_properties
    from keyshard.spark_jobs.kafka_io import SparkKafka
    from keyshard.spark_jobs.planning import SourceError

    try:
        kafka_config = load_properties(args.kafka_config) if args.kafka_config else {}
        kafka = SparkKafka.from_options(
            {"bootstrap_servers": args.bootstrap_servers,
             **{f"kafka.{k}": v for k, v in kafka_config.items()}}
        )  # fmt: skip
        count_offsets(kafka, topics)
    except (SourceError, KafkaConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    spark = job_session("keyshard-sessionize", args.master)
    try:
        result = run_pipeline(
            spark,
            bootstrap_servers=args.bootstrap_servers,
            kafka_config=kafka_config,
            topics=topics,
            output=args.output,
            rejects=args.rejects,
            ranges=args.ranges,
            gap_ms=round(args.gap_minutes * 60_000),
            mode=args.mode,
        )
    except NothingRead as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        from pyspark.errors import AnalysisException

        if isinstance(err, AnalysisException):  # e.g. the output exists (--mode overwrite)
            print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
            return 2
        raise
    finally:
        spark.stop()
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    # Run the imported module's main, not this `__main__` copy, so nothing is pickled from
    # `__main__` (spark-submit runs this file as `__main__`).
    from keyshard.spark_jobs.pipeline import main as _main

    sys.exit(_main())
