"""Names vulture cannot see being used, each with who uses it. Never executed: vulture
only reads it (`vulture`, configured in pyproject.toml, run by scripts/test.sh).

Keep it short: code nobody uses is deleted, not listed here.
"""

# Public API of the consumer library (README, "Using the consumer"), called by users.
_.run_sync
_.request_stop
_.wait_registered

# Spark's Python Data Source API calls these; a pipeline's result row is printed as JSON.
_.streamReader
_.initialOffset
_.latestOffset
_.read_partitions
# Sessions are written to Parquet field by field; parse_click and reference_sessions are
# the plain-Python reference the tests hold the Spark job equal to (README, "Spark").
_.session_id, _.end_ms, _.duration_s, _.distinct_pages, _.entry_page, _.exit_page
_.purchases
_.parse_click
_.reference_sessions
# Handlers of executor consumers call it to log which member ran them.
_.current_member

# Serialized by pydantic and FastAPI: fields of the wire messages and of admin API views.
_.model_config
_.consumer_id
_.deadline_in_s, _.blocking_offsets, _.high_watermark, _.processed_per_s
_.last_heard_s_ago, _.range_lag, _.released_after_s, _.until_in_s, _.target_pending
_.end_offset
_.measured_speed, _.speed_factor
_.state_partition, _.imbalanced_for_s, _.unowned_slots, _.draining_ranges, _.fenced, _.counted_to
# ConsumerStats fields, read through as_dict() (asdict) by the benchmarks.
_.fetched, _.replayed, _.rewinds

# The sans-IO codec's interface for a transport, exercised by its tests: messages decoded
# before a bad frame, the answer to send, the partial frame held; the request types.
_.decoded
_.to_response
_.buffered_bytes
_.REQUEST_TYPES

# Called by aiokafka: the replicas' group assignor and rebalance listener.
_.on_assignment, _.on_partitions_revoked, _.on_partitions_assigned

# Reads the state log without joining the replicas: used by tests that check what a
# replica taking over would find.
_.read_state

# Called by asyncio (the channel's Protocol) and uvicorn (the in-loop server).
_.connection_made, _.data_received, _.eof_received, _.pause_writing, _.resume_writing
_.capture_signals, _.should_exit

# Settings of the libraries bench/_worker.py compares against.
_.dlq_enabled, _.ordering_mode, _.max_in_flight, _.process_count

# The standard library's HTTP server calls do_GET and log_message, and reads
# daemon_threads (a consumer's /healthz, /readyz and /metrics); logging.Formatter reads
# converter (the worker's JSON log lines).
_.do_GET, _.log_message, _.daemon_threads, _.converter
# Public API of the consumer library: exactly-once runs are the user's.
_.run_exactly_once

# The harness serves tests/ too, which vulture does not read: `keyshard worker` processes
# (tests/integration/test_worker.py) and the SASL_SSL Kafka node with its ACLs
# (tests/conftest.py).
_.spawn_cli
_.secured_broker, _.run_tool
# A route to Kafka that one consumer alone goes through (tests/integration/test_liveness.py).
_.heal
# A coordinator whose event loop a signal holds (tests/integration/test_failover.py).
_.hold_loop

# Read by the Kafka failover test (tests/integration/test_kafka_failovers.py): Kafka's own
# availability, and when each broker step came and how long it took.
_.received_ns
_.at_ns, _.took_s
