"""Unit tests for keyshard.local.processes: listening ports no client socket can take."""

from __future__ import annotations

import random
import socket

import pytest

from keyshard.local import processes
from keyshard.local.processes import free_port


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_bound() -> None:
    low, _high = processes._ephemeral_range()
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1  # chosen at random, not one port again and again
    for port in ports:
        assert port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            other = probe.getsockname()[1]
        # The busy port comes up twice before a free one.
        choices = iter([busy, busy, other])
        monkeypatch.setattr(processes, "_ephemeral_range", lambda: (65536, 65536))
        monkeypatch.setattr(random, "randrange", lambda _a, _b: next(choices))
        assert free_port() != busy


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "_ephemeral_range", lambda: (10500, 60999))
    port = free_port()
    assert 0 < port <= 65535
