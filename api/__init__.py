"""The admin HTTP API (`create_app(runtime)`), its metrics and its dashboard.

Layer: beside `coordinator.server`, over `coordinator.runtime`, whose public doors it uses
(`group_states()` to read, `coordinator.runtime.operations` to act). Only
`keyshard.daemon` imports it (import contracts in pyproject.toml).
"""
