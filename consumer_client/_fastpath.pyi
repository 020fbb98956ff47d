# The C extension consumer_client/_fastpath.c (optional: see consumer_client/fastpath.py).
from collections.abc import Callable
from typing import Any

from _typeshed import ReadableBuffer, WriteableBuffer

DONE: int
PYTHON: int
SUSPENDED: int
RAISED: int
AWAITABLE: int
CHANGED: int
LOAD_BUCKET_COUNT: int

def run(
    records: list[Any],
    start: int,
    progress: Any,
    grants: object,
    cursor: int,
    table: ReadableBuffer,
    header: str,
    lanes: dict[object, Any],
    handler: Callable[[Any], Any],
    load: WriteableBuffer,
    /,
) -> tuple[int, int, int, int, int, bytes | None, Any, Any]: ...
def hash(data: bytes, /) -> int: ...
