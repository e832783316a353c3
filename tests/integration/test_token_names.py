"""Issue 24 S5: ``POST /controlnode/tokens`` with a live token's name is a 409 ``CONFLICT`` naming
it (a fuzzer had demoted ``bootstrap-admin`` to operator by creating it again); rotation is the
explicit ``POST /controlnode/tokens/{name}/rotate`` and ``karios token rotate NAME`` (real gateway,
the real CLI as a process)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from tests.fixtures.apps import ADMIN

pytestmark = pytest.mark.integration


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def gw(settings, serve) -> AsyncIterator[httpx.AsyncClient]:
    app = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=app.url, timeout=30) as c:
        yield c


async def whoami(c: httpx.AsyncClient, token: str) -> tuple[int, str | None]:
    r = await c.get("/controlnode/tokens/self", headers=bearer(token))
    return r.status_code, r.json().get("role") if r.status_code == 200 else None


async def test_a_live_name_is_a_conflict_and_nothing_changes(gw):
    first = await gw.post(
        "/controlnode/tokens", json={"name": "ops-ann", "role": "fabric_admin"}, headers=ADMIN
    )
    assert first.status_code == 201, first.text
    again = await gw.post("/controlnode/tokens", json={"name": "ops-ann", "role": "viewer"}, headers=ADMIN)
    assert again.status_code == 409, again.text
    body = again.json()
    assert (body["code"], body["field"]) == ("CONFLICT", "name") and "'ops-ann'" in body["message"]
    assert await whoami(gw, first.json()["token"]) == (200, "fabric_admin")  # neither replaced nor demoted

    # the report's case: the bootstrap admin cannot be demoted by creating it again
    r = await gw.post(
        "/controlnode/tokens", json={"name": "bootstrap-admin", "role": "operator"}, headers=ADMIN
    )
    assert r.status_code == 409, r.text
    me = await gw.get("/controlnode/tokens/self", headers=ADMIN)
    assert me.json() == {"name": "bootstrap-admin", "role": "fabric_admin"}


async def test_rotation_is_explicit_and_the_old_secret_stops_working(gw):
    made = await gw.post("/controlnode/tokens", json={"name": "ci-bot", "role": "operator"}, headers=ADMIN)
    old = made.json()["token"]
    r = await gw.post("/controlnode/tokens/ci-bot/rotate", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "ci-bot" and r.json()["role"] == "operator"  # role kept
    new = r.json()["token"]
    assert new != old
    assert (await whoami(gw, old))[0] == 401
    assert await whoami(gw, new) == (200, "operator")

    r = await gw.post("/controlnode/tokens/ci-bot/rotate", json={"role": "viewer"}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["role"] == "viewer", r.text
    assert await whoami(gw, r.json()["token"]) == (200, "viewer")

    missing = await gw.post("/controlnode/tokens/nobody/rotate", headers=ADMIN)
    assert (missing.status_code, missing.json()["code"]) == (404, "NOT_FOUND")
    r = await gw.post("/controlnode/tokens/ci-bot/rotate", headers=bearer(new))  # viewer: not allowed
    assert r.status_code in (401, 403), r.text


async def test_a_revoked_name_may_be_created_again(gw):
    await gw.post("/controlnode/tokens", json={"name": "temp", "role": "viewer"}, headers=ADMIN)
    assert (await gw.delete("/controlnode/tokens/temp", headers=ADMIN)).status_code == 200
    r = await gw.post("/controlnode/tokens", json={"name": "temp", "role": "viewer"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    assert await whoami(gw, r.json()["token"]) == (200, "viewer")


async def _karios(url: str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "KARIOS_URL": url, "KARIOS_TOKEN": ADMIN["Authorization"].removeprefix("Bearer ")}
    env["KARIOS_CONFIG"] = str(tmp_path / "cli.json")
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "karios"),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_the_cli_refuses_a_taken_name_and_rotates(gw, tmp_path):
    url = str(gw.base_url)
    code, out, _ = await _karios(url, tmp_path, "token", "create", "cli-rot", "--role", "viewer")
    assert code == 0 and out.strip().startswith("kt_"), out
    code, _, err = await _karios(url, tmp_path, "token", "create", "cli-rot", "--role", "fabric_admin")
    assert code != 0 and "cli-rot" in err and "rotate" in err and "Traceback" not in err, err
    assert await whoami(gw, out.strip()) == (200, "viewer")
    code, rotated, err = await _karios(url, tmp_path, "--output", "json", "token", "rotate", "cli-rot")
    assert code == 0, err
    new = json.loads(rotated)
    assert (new["name"], new["role"]) == ("cli-rot", "viewer")
    assert (await whoami(gw, out.strip()))[0] == 401
    assert await whoami(gw, new["token"]) == (200, "viewer")
