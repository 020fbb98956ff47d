"""The coordinator <-> consumer protocol: messages, sans-IO codec, wire conversion, channel.

The coordinator and every consumer (`consumer_client`, `spark_jobs`) speak through it.

- `messages`: the validated message models.
- `codec`: frames <-> messages, no I/O.
- `wire`: the model's values <-> message fields.
- `channel`: one asyncio connection over the codec, used by both ends.

Its place among the packages: the import contracts in pyproject.toml.
"""
