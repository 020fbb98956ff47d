"""Spark's own Kafka source (`spark.read.format("kafka")`) for the benchmarks.

`spark-kafka-pom.xml` beside this file names the connector; the harness's Maven code
(`harness.brokers.kafka.collect_jars`) collects it with its dependencies once into the
project's cache ($KEYSHARD_CACHE, default ~/.cache/keyshard). `spark_kafka_jars()` gives
the jars for `spark.jars`, without those PySpark already ships (matched by artifact name,
whatever their version): a second scala-library or an slf4j-api 1.7 beside PySpark's 2.0
would be a class-path conflict.
"""

from __future__ import annotations

import re
from pathlib import Path

from harness.brokers.kafka import collect_jars

POM = Path(__file__).with_name("spark-kafka-pom.xml")
#: The version is the last `-<digit>...` part, with an optional `-M2`/`-jre`-like tail.
_VERSIONED = re.compile(r"^(?P<artifact>.+)-\d[^-]*(?:-[A-Za-z][\w.]*)?\.jar$")


def artifact(jar: str) -> str:
    """`kafka-clients-3.9.2.jar` -> `kafka-clients`."""
    match = _VERSIONED.match(jar)
    return match.group("artifact") if match else jar


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def spark_kafka_jars() -> list[Path]:
    """The connector's jars that PySpark lacks, collected from Maven Central on first use."""
    collected = collect_jars(POM, "spark-kafka-jars", "spark-sql-kafka-0-10_2.13-*.jar")
    shipped = {artifact(p.name) for p in pyspark_jars().glob("*.jar")}
    return sorted(p for p in collected.glob("*.jar") if artifact(p.name) not in shipped)


def connector_version() -> str:
    """The connector's version, from the collected jar's name."""
    for jar in spark_kafka_jars():
        if artifact(jar.name) == "spark-sql-kafka-0-10_2.13":
            return jar.name.removeprefix("spark-sql-kafka-0-10_2.13-").removesuffix(".jar")
    raise LookupError("no spark-sql-kafka jar collected")


if __name__ == "__main__":
    print("Spark's Kafka source jars:", " ".join(str(p) for p in spark_kafka_jars()))
