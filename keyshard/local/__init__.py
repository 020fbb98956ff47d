"""Local tooling: embedded broker, process helpers, demo.

Layer: the top, beside `keyshard.cli`. The one part of `coordinator` besides the CLI
that may import `consumer_client` (the demo runs consumer apps). Tests and benchmarks
start their brokers and processes with these helpers too.
"""
