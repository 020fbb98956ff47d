"""What the coordinator and its consumers share: the kernel both sides import.

`model` (slots, slot ranges, positions, addresses), `protocol` (the messages, the sans-I/O
codec and the channel of docs/protocol.md), `kafka` (Kafka client settings in Kafka's own
names, and starting clients), `security` (TLS contexts from PEM files). Nothing here
knows about groups, assignment or the consumer's data path.

Which package may import which, here and around it: the import contracts in
pyproject.toml.
"""
