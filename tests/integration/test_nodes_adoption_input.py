"""Node adoption refuses what it must not connect to or carry (issue 24 S5), on the real gateway,
inventory and fabric worker (NATS + PostgreSQL), no lab:

- unspecified, loopback, broadcast, multicast, link-local (and IPv4-mapped forms) node addresses:
  422 naming ``node_ip``, no connection tried, nothing stored; loopback only when configured
  (``KARIOS_ADOPT_ALLOW_LOOPBACK``, a lab on one machine);
- a hostname with a newline or control character, a user name with shell metacharacters: 422
  naming the field;
- a port that refuses and a peer that closes the connection get the same answer (no port scan by
  adoption): one generic NODE_UNREACHABLE message, the cause only in the worker's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN, free_port
from tests.fixtures.fabric import sql

pytestmark = pytest.mark.integration
PASSWORD = "adopt-input-pw-7q"


async def _gateway(settings, serve, *, allow_loopback: bool):  # type: ignore[no-untyped-def]
    settings = settings.model_copy(update={"adopt_allow_loopback": allow_loopback})
    await serve(inventory_app(settings))
    rollout = FabricWorkerSettings(_env_file=None, ssh_key=None, connect_timeout=3, verify_timeout=30)
    await serve(worker_app(settings, rollout_settings=rollout))
    return (await serve(gateway_app(settings))).url


async def test_addresses_names_and_users_that_adoption_refuses(settings, serve):
    url = await _gateway(settings, serve, allow_loopback=False)
    good = {"node_ip": "192.0.2.10", "ssh_password": PASSWORD}
    cases = {
        "node_ip": [
            "0.0.0.0",
            "::",
            "127.0.0.1",
            "127.3.4.5",
            "::1",
            "::ffff:127.0.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "ff02::1",
            "169.254.10.1",
            "fe80::1",
            "240.0.0.1",
        ],
        "hostname": ["node1\nlogger pwned", "node\x07one", "node one", "node;id", "-node", "a" * 64],
        "ssh_username": ["root; id", "root\nid", "$(id)", "ro`ot`", "a b", "root|id", "9root", ""],
    }
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=ADMIN) as c:
        for field, values in cases.items():
            for value in values:
                body = {**good, field: value}
                r = await c.post("/controlnode/nodes", json=body)
                assert r.status_code == 422, (field, value, r.text)
                err = r.json()
                fields = {err.get("field")} | {e.get("field") for e in err.get("errors") or []}
                assert field in fields, (field, value, r.text)
                assert PASSWORD not in r.text
        r = await c.post("/controlnode/nodes", json={**good, "node_ip": "127.0.0.1"})
        assert "loopback" in r.json()["message"] and "127.0.0.1" in r.json()["message"], r.text
    assert await sql(settings, "SELECT 1 FROM inventory.compute_nodes") == []


@contextlib.asynccontextmanager
async def _closing_peer():  # type: ignore[no-untyped-def]
    """A TCP port that accepts and closes at once (the connection is lost before SSH)."""

    async def close(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    server = await asyncio.start_server(close, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connect() is refused
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_refused_and_lost_connections_answer_alike(settings, serve):
    url = await _gateway(settings, serve, allow_loopback=True)  # a lab on one machine
    async with _closing_peer() as lost_port, httpx.AsyncClient(base_url=url, timeout=30, headers=ADMIN) as c:
        answers = {}
        for kind, port in (("refused", free_port()), ("lost", lost_port)):
            r = await c.post(
                "/controlnode/nodes",
                json={"node_ip": "127.0.0.1", "ssh_password": PASSWORD, "ssh_port": port},
            )
            assert r.status_code == 502, (kind, r.text)
            body = r.json()
            assert body["code"] == "NODE_UNREACHABLE" and f"127.0.0.1 port {port}" in body["message"], body
            answers[kind] = body["message"].replace(str(port), "PORT")
            low = body["message"].lower()
            assert not re.search(
                r"errno|connection (refused|lost|reset)|timed out|unreachable|closed by", low
            ), body
    assert answers["refused"] == answers["lost"], answers
    assert await sql(settings, "SELECT 1 FROM inventory.compute_nodes WHERE node_ip = '127.0.0.1'") == []
