"""An asyncio event loop on a daemon thread of its own, for the work that says a replica
is alive (its beats, its membership in the replicas' Kafka group): that work must go on
while the main loop is held by a storm of requests, as Kafka's consumers heartbeat from a
thread apart from their polling.

Whatever runs there owns its own Kafka clients (an aiokafka client belongs to the loop
it was made on) and shares with the main loop only values that are replaced whole, never
mutated, or handed over through `asyncio`'s thread-safe calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
JOIN_S = 5.0  # how long `stop` waits for the thread to end


class LoopThread:
    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
        self._loop, self._thread = loop, thread
        thread.start()

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the thread's loop; the caller's loop waits for it (and cancelling
        the caller cancels `work`)."""
        return await asyncio.wrap_future(self.spawn(work))

    def spawn(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `work` on the thread's loop (`cancel()` on the result cancels it)."""
        if self._loop is None:
            work.close()
            raise RuntimeError(f"the {self.name} thread is not running")
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    async def stop(self) -> None:
        """Cancel whatever still runs on the thread, then end it."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        if thread.is_alive():
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_cancel_all(), loop))
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join, JOIN_S)
        if not thread.is_alive():
            loop.close()


async def _cancel_all() -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
