"""`host:port` as every side writes it: flags, the coordinator list, Metadata replies.

One parser, so a consumer, the daemon and the protocol agree on what an address is. The
host is everything before the last colon (an IPv6 literal keeps its own colons); the
port is 1..65535 in ASCII digits.
"""

from __future__ import annotations

LOOPBACK = "127.0.0.1"  # where every default listener binds: nothing is exposed by default


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text[:300]!r} is not host:port")
    return host, int(port)


def parse_host_ports(text: str) -> list[tuple[str, int]]:
    """A comma-separated list of `host:port` (spaces around the commas allowed)."""
    return [parse_host_port(part.strip()) for part in text.split(",")]
