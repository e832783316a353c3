"""The pure parts of the gateway's outbox and of its error documentation (no servers).

- a relay row carries what ``Bus.send_command`` needs and gives back the typed command;
- the retry rule: a bus outage is retried forever with a bounded backoff, anything else is terminal;
- every 4xx/5xx of the published document names ErrorResponse, and path ids are bounded.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from karios.api_gateway.errordoc import REF, add_error_responses
from karios.api_gateway.outbox import RETRY_MAX_S, OutboxRow, RelayRetry
from karios.common.contracts.provision import ProvisionSpec, StartProvision
from karios.common.errors import NotFound, ServiceUnavailable
from karios.common.limits import ID_MAX

DOC = Path(__file__).resolve().parents[3] / "docs" / "openapi" / "gateway.json"
NOW = datetime.now(UTC)
CUSTOM = {"application/json": {"schema": {"$ref": "#/x"}}}


def test_a_row_gives_back_the_typed_command():
    cmd = StartProvision(job_id="j1", spec=ProvisionSpec(bmc_ip="10.0.0.1", vendor="dell", hostname="n1"))
    row = OutboxRow(
        type=cmd.TYPE, subject="p.cmd.provision.start", msg_id="j1", data=cmd.model_dump(mode="json")
    )
    assert OutboxRow.model_validate_json(row.model_dump_json()).command() == cmd


def test_a_row_of_an_unknown_command_type_is_refused():
    row = OutboxRow(type="karios.nope.v1", subject="s", msg_id="m", data={})
    with pytest.raises(ValueError, match=r"karios\.nope\.v1"):
        row.command()


def _delay(attempts: int, exc: BaseException | None) -> float | None:
    return RelayRetry().get_next_attempt_delay(
        first_attempt_at=NOW, last_attempt_at=NOW, attempts_count=attempts, exception=exc
    )


@pytest.mark.parametrize("exc", [ServiceUnavailable("bus down"), TimeoutError(), ConnectionError(), None])
def test_a_bus_outage_is_retried_forever_with_a_bounded_backoff(exc):
    delays = [_delay(n, exc) for n in (1, 2, 3, 10, 1000, 10**6)]
    assert all(d is not None and 0 < d <= RETRY_MAX_S for d in delays), delays
    assert delays[0] < delays[2] and delays[-1] == RETRY_MAX_S


@pytest.mark.parametrize("exc", [ValueError("bad row"), NotFound("no such thing"), KeyError("x")])
def test_a_row_that_can_never_be_published_is_terminal(exc):
    assert _delay(1, exc) is None


def test_added_error_responses_name_error_response_and_keep_route_bodies():
    doc = {
        "paths": {
            "/controlnode/x/{id}": {
                "post": {
                    "security": [{"HTTPBearer": []}],
                    "parameters": [{"name": "id", "in": "path"}],
                    "requestBody": {"content": {}},
                    "responses": {
                        "200": {"description": "ok"},
                        "409": {
                            "description": "custom",
                            "content": {"application/json": {"schema": {"$ref": "#/x"}}},
                        },
                    },
                }
            },
            "/healthz": {"get": {"responses": {"200": {"description": "ok"}}}},
        }
    }
    out = add_error_responses(doc)
    responses = out["paths"]["/controlnode/x/{id}"]["post"]["responses"]
    assert sorted(responses) == ["200", "401", "403", "409", "413", "422", "503"]
    assert responses["409"]["content"]["application/json"]["schema"] == {"$ref": "#/x"}
    assert responses["503"]["content"]["application/json"]["schema"] == {"$ref": REF}
    assert "content" not in responses["200"]
    assert sorted(out["paths"]["/healthz"]["get"]["responses"]) == ["200"]
    assert "ErrorResponse" in out["components"]["schemas"]
    assert add_error_responses(json.loads(json.dumps(out))) == out  # idempotent


def test_the_published_document_names_error_response_for_every_error_and_bounds_path_ids():
    doc = json.loads(DOC.read_text())
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for code, response in op["responses"].items():
                if code[0] in "45":
                    schema = response.get("content", {}).get("application/json", {}).get("schema")
                    assert schema is not None, (method, path, code)
            for p in op.get("parameters", []):
                if p["in"] == "path":
                    assert p["schema"].get("maxLength") or p["schema"].get("enum"), (method, path, p["name"])
    get_job = doc["paths"]["/controlnode/job/{id}"]["get"]
    assert get_job["parameters"][0]["schema"]["maxLength"] == ID_MAX
