"""Property-based check of the admin API against its own OpenAPI document.

schemathesis generates requests (valid and invalid) for every operation of
create_app(runtime) over an in-memory group: no answer may be a 5xx, and every answer must
match the documented status codes and schemas. Reads are protected too here, so the
"auth is not ignored" check covers every operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import schemathesis
from hypothesis import HealthCheck, settings

from keyshard.api.app import create_app
from tests.api.fake_runtime import fake_runtime

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiOperation

TOKEN = "schema-token"
app = create_app(fake_runtime(), admin_token=TOKEN, auth_reads=True)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case[OpenApiOperation]) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"})
