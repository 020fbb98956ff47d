"""Records compressed with every codec Kafka producers use reach the handler: gzip,
snappy, lz4 and zstd (the codecs come with keyshard: aiokafka's extras, cramjam)."""

from __future__ import annotations

import pytest

from harness import CoordinatorProcess, Workers, create_topic, produce, wait_for
from keyshard.local.verify import check

pytestmark = pytest.mark.integration
CODECS = ("gzip", "snappy", "lz4", "zstd")


async def test_every_codec_reaches_the_handler(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap, partitions=2)
    produced = []
    for i, codec in enumerate(CODECS):
        produced += await produce(coordinator.bootstrap, 500, 50, start=500 * i, compression=codec)
    for name in ("a", "b"):
        workers.spawn(name)
    await wait_for(lambda: workers.unique() >= len(produced), 60, "every record processed")
    report = check(produced, workers.processed())
    assert report.lost == [] and report.order_violations == [] and report.duplicates == 0
    for name, proc in workers.procs.items():
        assert proc.poll() is None, f"{name} died: {(workers.out_dir / f'{name}.err').read_text()}"
