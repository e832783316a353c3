"""Issue 12 item 5: the hand-made bad inputs that answered 500 now answer 4xx naming the field,
and nothing is written (real gateway, inventory and fabric worker on NATS and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.app import create_app as gateway_app
from karios.fabric_worker.app import create_app as worker_app
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import BASE

JSON = {**ADMIN, "Content-Type": "application/json"}
SCOPED = "fe80::1%" + "e" * 80  # a valid scoped IPv6 address, longer than the varchar(64) column


async def _count(url: str, sql: str) -> int:
    eng = create_async_engine(url)
    try:
        async with eng.connect() as conn:
            return int((await conn.execute(sa.text(sql))).scalar_one())
    finally:
        await eng.dispose()


async def _execute(url: str, sql: str) -> None:
    eng = create_async_engine(url)
    try:
        async with eng.begin() as conn:
            await conn.execute(sa.text(sql))
    finally:
        await eng.dispose()


async def _rows(url: str) -> tuple[int, int]:
    nodes = await _count(url, "SELECT count(*) FROM inventory.bmc_infos")
    jobs = await _count(url, "SELECT count(*) FROM gateway.jobs")
    return nodes, jobs


@pytest.fixture
async def gw(settings, serve) -> AsyncIterator[httpx.AsyncClient]:
    await serve(inventory_app(settings))
    app = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=app.url, timeout=30) as c:
        yield c


def _field(r: httpx.Response) -> str:
    return str(r.json().get("field", ""))


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length 20 MB", "chunked 20 MB"])
async def test_body_over_the_limit_is_413(gw, settings, chunked):
    before = await _rows(settings.database_url)
    head, tail, filler = b'{"bmc_ip": "10.0.0.7", "os_hostname": "', b'"}', b"a" * 1024 * 1024

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: Transfer-Encoding chunked
        yield head
        for _ in range(20):
            yield filler
        yield tail

    content = chunks() if chunked else head + filler * 20 + tail
    r = await gw.post("/controlnode/register", content=content, headers=JSON)
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert "limit is 1048576 bytes" in r.json()["message"]
    assert await _rows(settings.database_url) == before
    # A body under the limit still works after a refused one.
    ok = await gw.post("/controlnode/register", json={"bmc_ip": "10.0.0.8"}, headers=ADMIN)
    assert ok.status_code == 200, ok.text
    await _execute(settings.database_url, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = '10.0.0.8'")


REGISTER_CASES = [
    ("scoped IPv6 bmc_ip longer than its column", {"bmc_ip": SCOPED}, "bmc_ip"),
    ("os_hostname with NUL", {"bmc_ip": "10.0.0.9", "os_hostname": "mgmt\u000001"}, "os_hostname"),
    ("atlas_device_id over int4", {"bmc_ip": "10.0.0.9", "atlas_device_id": 2147483648}, "atlas_device_id"),
    ("a 900 KB hostname", {"bmc_ip": "10.0.0.9", "os_hostname": "h" * 900_000}, "os_hostname"),
    # Found by the stateful fuzzer: asyncssh SASLpreps the user name and password before it
    # connects, so the fabric diff of such a node answered 500. Refused where they come in.
    ("os_username SSH cannot send", {"bmc_ip": "10.0.0.9", "os_username": "ro\x11ot"}, "os_username"),
    ("os_username unassigned", {"bmc_ip": "10.0.0.9", "os_username": "\U0006b3ea"}, "os_username"),
    (
        "os_password with a control character",
        {"bmc_ip": "10.0.0.9", "os_password": "pa\x11ss"},
        "os_password",
    ),
    (
        "os_password unassigned in Unicode 3.2",
        {"bmc_ip": "10.0.0.9", "os_password": "\U0006b3ea"},
        "os_password",
    ),
]


@pytest.mark.parametrize(("case", "body", "field"), REGISTER_CASES, ids=[c[0] for c in REGISTER_CASES])
async def test_register_refuses_with_the_field(gw, settings, case, body, field):
    before = await _rows(settings.database_url)
    r = await gw.post("/controlnode/register", json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert _field(r) == field, r.text
    assert await _rows(settings.database_url) == before


async def test_lone_surrogate_is_422_naming_the_field(gw, settings):
    before = await _rows(settings.database_url)
    raw = b'{"bmc_ip": "10.0.0.9", "os_hostname": "mgmt\\ud800x"}'  # JSON escape of a lone surrogate
    r = await gw.post("/controlnode/register", content=raw, headers=JSON)
    assert r.status_code == 422, r.text
    assert _field(r) == "os_hostname", r.text
    assert await _rows(settings.database_url) == before


PROVISION_CASES = [
    ("a 256-character hostname", {"hostname": "h" * 256}, "hostname"),
    ("a 65-character parent_id", {"parent_id": "p" * 65}, "parent_id"),
    ("a scoped IPv6 bmc_IP longer than its column", {"bmc_IP": SCOPED}, "bmc_IP"),
    ("a 33-character vendor", {"vendor": "v" * 33}, "vendor"),
    ("an os_password SSH cannot send", {"os_password": "pa\x07ss"}, "os_password"),
]


@pytest.mark.parametrize(("case", "extra", "field"), PROVISION_CASES, ids=[c[0] for c in PROVISION_CASES])
async def test_provision_refuses_with_the_field(gw, settings, case, extra, field):
    before = await _rows(settings.database_url)
    body = {"bmc_IP": "127.0.3.40", "vendor": "generic", **extra}
    r = await gw.post("/controlnode/provision", json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert _field(r) == field, r.text
    assert await _rows(settings.database_url) == before


@pytest.mark.parametrize("name", ["actor", "action", "target", "since", "until"])
async def test_audit_filter_with_a_nul_is_422_naming_it(gw, name):
    """Found by the stateful fuzzer: PostgreSQL text holds no NUL, the query answered 500."""
    r = await gw.get("/controlnode/audit", params={name: "x\x00y"}, headers=ADMIN)
    assert r.status_code == 422 and _field(r) == name, r.text


def test_a_refused_password_is_never_echoed():
    """The 422 says why, not what: a password's characters are not in the message."""
    from karios.common.devicetext import ssh_password_problem

    secret = "s3cr\x11t-\U0006b3ea"
    problem = ssh_password_problem(secret)
    assert problem and "SASLprep" in problem
    assert not any(ch in problem for ch in ("\x11", "\U0006b3ea", "s3cr"))
    assert ssh_password_problem("ünïcødé pässwörd 42!") is None  # assigned characters pass


async def test_non_ascii_last_event_id_is_treated_as_absent(gw):
    headers = [*ADMIN.items(), ("Last-Event-ID", "\u0661\u0662".encode())]  # Arabic-Indic 12
    async with gw.stream("GET", "/controlnode/events", headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = []
        async for line in r.aiter_lines():  # up to the relay's ": connected" comment
            lines.append(line)
            if line.startswith(":") and "connected" in line:
                break
            assert len(lines) < 10, lines
        assert not any(line.startswith("event:") for line in lines), lines


FABRIC_CASES = [
    ("ospf_area of 5000 digits", {"ospf_area": "9" * 5000}, "ospf_area"),
    ("ospf_auth_key_id 10^100", {"ospf_auth_key_id": 10**100}, "ospf_auth_key_id"),
    (  # issue 23 item 7: lines injected into the switch configuration
        "fabric_switch_name with config lines",
        {"fabric_switch_name": "x\nrouter bgp 1\n neighbor 6.6.6.6 remote-as 1"},
        "fabric_switch_name",
    ),
    ("acked_by with a NUL", {"acked_by": "olga\x00"}, "acked_by"),
]


@pytest.mark.parametrize(("case", "body", "field"), FABRIC_CASES, ids=[c[0] for c in FABRIC_CASES])
async def test_fabric_config_refuses_with_the_field(settings, serve, case, body, field):
    await serve(worker_app(settings))
    app = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=app.url, timeout=30) as c:
        r = await c.post("/controlnode/fabric-config", json={**BASE, **body}, headers=ADMIN)
        stored = await c.get("/controlnode/fabric-config", headers=ADMIN)
        if r.status_code < 300:  # leave no configuration behind for the other tests
            await c.delete("/controlnode/fabric-config", headers=ADMIN)
    assert r.status_code == 422, r.text
    assert _field(r) == field, r.text
    assert stored.status_code == 404 or str(body[field]) not in stored.text


CALLBACK_CASES = [
    ("complete with an os_ip that is no address", "complete", {"os_ip": "999.1.1.1"}, "os_ip"),
    ("complete with an unknown field", "complete", {"os_ip": "", "root_password": "x"}, "root_password"),
    (
        "step with percent as a string",
        "step",
        {"step": "network", "state": "done", "percent": "50"},
        "percent",
    ),
    ("step with an unknown field", "step", {"step": "network", "state": "done", "extra": 1}, "extra"),
    ("complete with an os_password SSH cannot send", "complete", {"os_password": "\x1b[0m"}, "os_password"),
]


@pytest.mark.parametrize(
    ("case", "verb", "body", "field"), CALLBACK_CASES, ids=[c[0] for c in CALLBACK_CASES]
)
async def test_installer_callbacks_refuse_with_the_field(gw, case, verb, body, field):
    """Issue 24 D8: callbacks took "999.1.1.1" as the node's address, "50" as a percent, and
    ignored unknown fields while every other body answered 422."""
    job = "3f2b6c1e-8d4a-4f7e-9c2b-1a5e7d9f0b3c"
    r = await gw.post(f"/controlnode/job/{job}/{verb}", json=body, headers={"Authorization": "Bearer kj_x"})
    assert r.status_code == 422, r.text
    assert _field(r) == field, r.text


async def test_firstboot_refuses_an_unknown_field(gw):
    body = {"bmc_ip": "10.0.0.9", "os_ip": "10.0.0.10", "hostname": "x"}
    r = await gw.post("/controlnode/firstboot", json=body, headers={"Authorization": "Bearer kj_x"})
    assert r.status_code == 422 and _field(r) == "hostname", r.text
