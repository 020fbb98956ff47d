"""Measured load per slot, from the processed counts consumers report on every Ping.

Counts are kept per load bucket (16 slots) and decay exponentially with a half-life, so
the estimate follows traffic that shifts without being thrown by one noisy ping. Decay is
lazy: values are stored scaled by exp(+lambda * (t - origin)), so adding a report touches
only the buckets it names — a ping costs O(reported buckets), not O(4096).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from keyshard.core.model.hashing import LOAD_BUCKET_COUNT, LOAD_BUCKET_SHIFT, SLOT_COUNT

_REBASE_AFTER = 50.0  # rebase the scaling origin before exp() could overflow


class BucketLoad:
    def __init__(self, half_life_s: float = 30.0) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")
        self._lambda = math.log(2) / half_life_s
        self._origin: float | None = None
        self._scaled: dict[int, float] = {}

    def __eq__(self, other: object) -> bool:
        """Equal measurements (tests compare whole group states)."""
        return isinstance(other, BucketLoad) and self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value, not hashable

    def _values(self) -> tuple[float, float | None, dict[int, float]]:
        return self._lambda, self._origin, self._scaled

    def add(self, counts: Iterable[tuple[int, int]], at: float) -> None:
        if self._origin is None:
            self._origin = at
        if self._lambda * (at - self._origin) > _REBASE_AFTER:
            self._rebase(at)
        scale = math.exp(self._lambda * (at - self._origin))
        for bucket, count in counts:
            if 0 <= bucket < LOAD_BUCKET_COUNT and count > 0:
                self._scaled[bucket] = self._scaled.get(bucket, 0.0) + count * scale

    def rates(self, at: float) -> dict[int, float]:
        """Records per second per bucket (decayed count x lambda: the exponential-window rate)."""
        if self._origin is None:
            return {}
        factor = math.exp(-self._lambda * (at - self._origin)) * self._lambda
        return {b: v * factor for b, v in self._scaled.items() if v > 0}

    def slot_load(self, at: float) -> list[float] | None:
        """Per-slot rate (a bucket's rate spread evenly over its slots), None if nothing
        was measured yet."""
        rates = self.rates(at)
        if not rates:
            return None
        width = 1 << LOAD_BUCKET_SHIFT
        load = [0.0] * SLOT_COUNT
        for bucket, rate in rates.items():
            share = rate / width
            start = bucket << LOAD_BUCKET_SHIFT
            load[start : start + width] = [share] * width
        return load

    def _rebase(self, at: float) -> None:
        assert self._origin is not None
        factor = math.exp(-self._lambda * (at - self._origin))
        self._scaled = {b: v * factor for b, v in self._scaled.items() if v * factor > 1e-12}
        self._origin = at
