"""API tests run a real daemon with an admin token (the shared `coordinator` fixture
with `ADMIN_ARGS`), and real consumer workers on it."""

from __future__ import annotations

ADMIN_TOKEN = "admin-test-token"
ADMIN_ARGS = ("--admin-token", ADMIN_TOKEN)
