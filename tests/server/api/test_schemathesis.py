"""Schemathesis against the OpenAPI document of the app (in process, `auth="required"`, its gate
in front), with an all-projects admin token, positive and negative data, on both dialects: no
response is a 5xx and no request raises.

Bounded: a fixed seed and `MAX_EXAMPLES` per operation (about 1,300 requests a dialect). Only
`not_a_server_error` is checked: other checks report semantic limits the schema cannot express
(a v1 batch refusing v2 fields) and Starlette's `Allow` header on OPTIONS.

Run as `schemathesis run` runs (the same engine, phases and configuration), through its ASGI
transport instead of a socket: the counts below are the CLI's "Tested" and "generated".
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events
from schemathesis.engine.statistic import Statistic
from schemathesis.python import asgi

from ampscope_server.api.app import create_app
from ampscope_server.config import Settings
from tests.support.app import BASE_URL
from tests.support.databases import Dialect, migrated_database
from tests.support.team import make_tokens

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 30
SEED = 1


@pytest.fixture
def database(dialect: Dialect, tmp_path: Path) -> Iterator[str]:
    with migrated_database(dialect, tmp_path) as url:
        yield url


def _config(token: str) -> SchemathesisConfig:
    """`schemathesis run --checks not_a_server_error --mode all --max-examples MAX_EXAMPLES
    --seed SEED --header "Authorization: Bearer <token>"`, as a schemathesis.toml would say it,
    at the address the gate answers to."""
    return SchemathesisConfig.from_dict({
        "seed": SEED,
        "base-url": BASE_URL,
        "headers": {"Authorization": f"Bearer {token}"},
        "checks": {"enabled": False, "not_a_server_error": {"enabled": True}},
        "generation": {"mode": "all", "max-examples": MAX_EXAMPLES},
    })


def test_no_input_is_a_server_error(database: str) -> None:
    token = make_tokens(database)["root"]
    app = create_app(Settings(db_url=database, auth="required"))
    schema = schemathesis.openapi.from_asgi(
        "/openapi.json", app, config=_config(token),
        headers={"Authorization": f"Bearer {token}", "Host": BASE_URL.removeprefix("http://")})
    statistic = Statistic()
    errors: list[str] = []
    try:
        for event in schemathesis.engine.from_schema(schema).execute():
            if isinstance(event, events.ScenarioFinished) and event.is_test_scenario:
                statistic.on_scenario_finished(event.recorder)
            elif isinstance(event, events.NonFatalError):
                # An exception the app raised (in process it reaches the client) is one of these.
                errors.append(f"{event.label}: {''.join(traceback.format_exception(event.value))}")
            elif isinstance(event, events.FatalError):
                errors.append(repr(event.exception))
            elif (isinstance(event, events.PhaseFinished) and event.phase.is_enabled
                  and event.status in (Status.FAILURE, Status.ERROR)):
                errors.append(f"{event.phase.name}: {event.status}")
    finally:
        # Schemathesis started the app's lifespan on first use and would keep it (engine, alerts
        # worker, live listener) until the interpreter exits.
        asgi.shutdown_lifespans()
    assert errors == []
    assert statistic.failures == {}
    assert statistic.errored_cases == 0
    assert len(statistic.tested_operations) >= 16, statistic.tested_operations
    assert statistic.total_cases >= 500, statistic.total_cases
