"""A library app with a Ctrl-C handler of its own and none for SIGTERM, as the integration
tests run it (`python -m tests.integration.sigint_app`): configured by the variables
`keyshard worker` reads, it logs to stdout and records each run like `worker_app`."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

from keyshard.consumer_client import CoordinatedConsumer
from tests.integration.worker_app import handle


def on_ctrl_c(signum: int, frame: Any) -> None:
    """The app's own SIGINT handler: it never runs in the tests."""
    print("the app's own Ctrl-C handler", file=sys.stderr)


async def main() -> None:
    consumer = CoordinatedConsumer(
        group=os.environ["KEYSHARD_GROUP"],
        topics=[os.environ["KEYSHARD_TOPICS"]],
        coordinator=os.environ["KEYSHARD_COORDINATOR"],
        bootstrap_servers=os.environ["KEYSHARD_BOOTSTRAP_SERVERS"],
        name=os.environ["KEYSHARD_NAME"],
        session_timeout_ms=int(os.environ["KEYSHARD_SESSION_TIMEOUT_MS"]),
    )
    async with consumer:
        await consumer.run(handle)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    signal.signal(signal.SIGINT, on_ctrl_c)
    asyncio.run(main())
