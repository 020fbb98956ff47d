"""Local tooling: the embedded broker, process helpers and the demo.

- `broker`: the embedded Kafka-protocol broker (Tansu) behind `keyshard broker`.
- `processes`: free ports and stopping child processes by pid.
- `demo`, `demo_worker`: `keyshard demo` and the consumer processes it runs.
- `verify`: the contract checked on produced records against handler logs.

Tests and benchmarks start their brokers and processes with these helpers too. Its place
among the packages: the import contracts in pyproject.toml.
"""
