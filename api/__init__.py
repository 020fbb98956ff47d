"""The admin HTTP API (`create_app(runtime)`), its metrics and its dashboard.

It reads through the runtime's `group_states()` and acts through
`coordinator.runtime.operations`, the runtime's two public doors.

- `app`: the routes; `models`: their request and response models (the OpenAPI contract).
- `auth`: the admin token checks; `forward`: requests about a group another replica serves.
- `metrics`: Prometheus metrics at scrape time; `rates`: processed rates from polling.

Its place among the packages: the import contracts in pyproject.toml.
"""
