"""TLS contexts and secret handling shared by every side.

The coordinator's Kafka clients, the consumer's Kafka clients and its channel to the
coordinator, the coordinator's channel listener and its admin API all build their TLS
contexts here, so a bad certificate gives the same clear error (naming the setting, never
a secret) wherever it is configured (`tls`).

Its place among the packages: the import contracts in pyproject.toml.
"""
