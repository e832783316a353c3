"""The pure rules of the audit trail (api_gateway.audit): which requests are audit events, what
their target is, how ``since`` reads; and that no secret-bearing body field can be a target."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from fastapi.routing import APIRoute

from karios.api_gateway.audit import (
    READ_ONLY_WRITES,
    WRITE_METHODS,
    audited_route,
    job_id_of,
    parse_since,
    target_of,
)
from karios.api_gateway.routes import ROUTERS
from karios.common.errors import ValidationFailed

JOB = "0b9e4c1e-8f7a-4a53-9d54-2f1c0f7e6a11"


def _writes() -> dict[tuple[str, str], APIRoute]:
    found = {}
    for router in ROUTERS():
        for route in router.routes:
            if isinstance(route, APIRoute):
                for method in route.methods & WRITE_METHODS:
                    found[(method, route.path)] = route
    return found


def test_every_operator_write_is_audited_and_nothing_else():
    writes = _writes()
    audited = {key for key, route in writes.items() if audited_route(route, key[0])}
    for must in (
        ("POST", "/controlnode/provision/dell"),
        ("POST", "/controlnode/provision"),
        ("POST", "/controlnode/unprovision"),
        ("POST", "/controlnode/job/{id}/cancel"),
        ("PATCH", "/controlnode/job/{id}"),
        ("POST", "/controlnode/tokens"),
        ("POST", "/controlnode/tokens/{name}/rotate"),
        ("DELETE", "/controlnode/tokens/{name}"),
        ("POST", "/controlnode/register"),
        ("POST", "/controlnode/fabric-config"),
        ("POST", "/controlnode/fabric-config/apply"),
        ("DELETE", "/controlnode/nodes/{node_ip}"),
    ):
        assert must in audited, must
    # the installer's callbacks (job tokens) and the queries that use POST are not audit events
    for never in (
        ("POST", "/controlnode/job/{id}/step"),
        ("POST", "/controlnode/job/{id}/complete"),
        ("POST", "/controlnode/firstboot"),
        ("POST", "/controlnode/job/{id}/phone-home"),
        ("POST", "/controlnode/provision/progress"),
        ("POST", "/controlnode/fabric-config/plan"),
    ):
        assert never in writes and never not in audited, never
    assert all(path in {p for _, p in writes} for path in READ_ONLY_WRITES)  # no stale entry
    route = writes[("POST", "/controlnode/tokens")]
    assert not audited_route(route, "GET") and not audited_route(None, "POST")


def test_the_target_is_a_path_parameter_else_an_identifying_body_field():
    assert target_of({"name": "ops-ann"}, None) == "ops-ann"
    assert target_of({"id": JOB}, b'{"bmc_IP": "10.0.0.9"}') == JOB  # the path wins
    assert target_of({}, json.dumps({"bmc_IP": "10.0.0.9", "os_password": "pw"}).encode()) == "10.0.0.9"
    assert target_of({}, b'{"node_ip": "10.1.0.5", "ssh_password": "x"}') == "10.1.0.5"
    assert target_of({}, b'{"name": "ci-bot", "role": "viewer"}') == "ci-bot"
    # never a secret-bearing field, never something that is no identifier
    body = {"bgp_password": "s3cret", "token": "kt_abc", "ospf_auth_key": "k", "root_pass": "r"}
    assert target_of({}, json.dumps(body).encode()) is None
    assert target_of({}, b'{"name": "two words; DROP"}') is None
    assert target_of({}, b"not json") is None and target_of({}, b"[1, 2]") is None


def test_the_job_id_comes_from_a_job_route_or_the_answer():
    assert job_id_of({"id": JOB}, "/controlnode/job/{id}/cancel", None) == JOB
    assert job_id_of({}, "/controlnode/provision/dell", json.dumps({"job_id": JOB}).encode()) == JOB
    assert job_id_of({"name": "x"}, "/controlnode/tokens/{name}", b'{"name": "x", "token": "kt_1"}') is None


def test_since_is_an_age_or_an_iso_time():
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    assert parse_since("30m", now) == datetime(2026, 12, 4, 11, 30, tzinfo=UTC)
    assert parse_since("2d", now) == datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert parse_since("2026-12-01T10:00:00Z") == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert parse_since("2026-12-01T10:00:00") == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    with pytest.raises(ValidationFailed) as exc:
        parse_since("yesterday")
    assert exc.value.field == "since"
    with pytest.raises(ValidationFailed):
        parse_since("999999w")  # before year 1: a 422, never a 500
