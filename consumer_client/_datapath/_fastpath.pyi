# The C extension consumer_client/_datapath/_fastpath.c (optional: see _datapath/fastpath.py).
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from _typeshed import ReadableBuffer, WriteableBuffer

DONE: int
PYTHON: int
SUSPENDED: int
RAISED: int
AWAITABLE: int
CHANGED: int
LOAD_BUCKET_COUNT: int

class NativeProgress(Protocol):
    """What `run` reads and writes by name on the partition (PartitionProgress)."""

    cursor: int  # written before every handler call: a handler may look at it
    grants: Any  # compared by identity after a handler: replaced -> CHANGED
    demand_upto: int  # written after the loop when records were first examined

class Outcome(tuple[Any, ...]):
    """One field per meaning; fields that do not apply to `status` are None."""

    @property
    def status(self) -> int: ...
    @property
    def at(self) -> int: ...
    @property
    def admitted(self) -> int: ...
    @property
    def processed(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def coroutine(self) -> Any: ...
    @property
    def yielded(self) -> Any: ...
    @property
    def error(self) -> BaseException | None: ...
    @property
    def awaitable(self) -> Any: ...

def run(
    records: list[Any],
    start: int,
    progress: NativeProgress,
    grants: object,
    cursor: int,
    table: ReadableBuffer,
    header: str,
    lanes: Mapping[object, object],
    handler: Callable[[Any], Any],
    load: WriteableBuffer,
    demand: WriteableBuffer,
    demand_from: int,
    /,
) -> Outcome: ...
def take(records: Sequence[Any], room: int, /) -> tuple[int, int, int]: ...
def hash(data: bytes, /) -> int: ...
