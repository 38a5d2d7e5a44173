"""Property-based: the REST API honours its own OpenAPI document.

Schemathesis reads ``/openapi.json`` from the application in-process (ASGI, no socket) and, for
every operation, sends generated requests (with a valid bearer token unless a negative case
drops it); every response must be
documented (status, content type, body schema, headers) and none may be a 5xx. Its
``ignored_auth`` check also re-sends requests without the token and expects a 401.

The world is the one of ``test_rest_api`` (three providers in the three breaker states).
"""

from __future__ import annotations

import asyncio
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case
from schemathesis.config import SchemathesisConfig

from tests.unit.test_rest_api import SECRET_TOKEN, build_world

# Built once, at collection: schemathesis parametrizes the test by the document's operations.
# The app runs in schemathesis's own event-loop thread; the view holds no loop-bound state.
WORLD = asyncio.run(build_world())
# The token is given for the document's `HTTPBearer` scheme (not as a header of each call), so
# schemathesis knows which requests carry it: negative cases that drop it expect the 401.
CONFIG = SchemathesisConfig.from_dict(
    {"auth": {"openapi": {"HTTPBearer": {"bearer": SECRET_TOKEN}}}}
)
schema = schemathesis.openapi.from_asgi("/openapi.json", WORLD.app(), config=CONFIG)


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_every_response_conforms_to_the_openapi_document(case: Case[Any]) -> None:
    case.call_and_validate()
