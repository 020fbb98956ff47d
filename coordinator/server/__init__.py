"""The coordinator's listening socket and one session per consumer connection.

- `listener`: the accept loop and each connection's channel (TLS included).
- `session`: one consumer connection: what it may send, in which order.
- `admission`: who may hold a connection, and for how long (caps, deadlines,
  throttled logging).

Its place among the packages: the import contracts in pyproject.toml.
"""
