"""Fuzz the whole gateway from its published OpenAPI document against a live system (issue 12).

Gateway, inventory (file inventory of five lab BMCs), provisioner and fabric-worker run
in-process on the real NATS and PostgreSQL; schemathesis runs as a subprocess (its client is
synchronous) with the admin token, at most 25 examples per operation, every operation but the
SSE stream (it never ends). Checks: no 5xx, every response conforms to its documented schema.

What a fuzzed address can reach is confined (:class:`tests.fixtures.fuzz.Confinement`): every TCP
connection must go to loopback and none to the SSH port, so a fuzzed BMC, node or mirror address
never leaves the machine and a fabric rollout finds no reachable node; every BMC the provisioner
is asked about (fuzzed registrations included) is answered by the sushy-tools Redfish emulator;
the installer mirror is a closed local port (preseed media come from the local netboot package).
Two nodes are registered on 127.0.3.x and a valid fabric config is stored first, so
apply/plan/drift get past "nothing to do". Fuzzed registrations, jobs and the fabric config are
removed afterwards (the session's database is shared). bootapi: ``test_fuzz_bootapi.py``.
``test_fuzz_counts_failures`` proves the runner reports what it finds.

``test_fuzz_gateway_stateful_sequences`` (issue 24 item 8) runs schemathesis' stateful phase on
the same system: it follows the OpenAPI links of the gateway's document (``api_gateway.linkdoc``)
to fuzz sequences — provision → the job → its callbacks → cancel, register → provision/inspect,
token → revoke, discovery report → adopt, fabric config → plan/preflight/apply → the apply's job —
for a fixed time, with the same checks. The callbacks get the token their boot medium would carry
from a test-only token source (``tests/fixtures/fuzz_hooks.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.linkdoc import LINKS
from karios.common.contracts.inventory import RegisterNode
from karios.common.contracts.nodes import AdoptNode
from karios.common.crypto import SecretBox
from karios.common.limits import SECRET_MAX, TEXT_MAX
from karios.fabric_worker.app import create_app as worker_app
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import BASE
from tests.fixtures.fuzz import HOOKS, OPENAPI, Confinement, EveryBmcIs, run_schemathesis, token_source
from tests.fixtures.provision import STACK_BMCS, retire_leftover_jobs, write_inventory
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = pytest.mark.slow  # minutes of real servers: not in -m quick


EXCLUDE = r"^/controlnode/events$"  # SSE never ends
# Token names the fuzzer learns from GET /controlnode/tokens would let it rotate or revoke its own
# token ("bootstrap-admin") and spend the rest of the run on 401s: these learn nothing.
OWN_TOKEN = (
    ("POST", "/controlnode/tokens"),
    ("DELETE", "/controlnode/tokens/{name}"),
    ("POST", "/controlnode/tokens/{name}/rotate"),
)
NODES = {STACK_BMCS[0]: "127.0.3.21", STACK_BMCS[1]: "127.0.3.22"}
# The stateful phase's budget: scenarios repeat until it is spent (a longer run: set it higher).
STATEFUL_SECONDS = int(os.environ.get("KARIOS_FUZZ_STATEFUL_SECONDS", "35"))


@pytest.fixture
def emulator():
    try:
        emu = RedfishEmulator([fake_system("fuzz1"), fake_system("fuzz2")], auth=True)
        emu.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


async def _registered(url: str) -> set[str]:
    eng = create_async_engine(url)
    try:
        async with eng.connect() as conn:
            return set((await conn.execute(sa.text("SELECT bmc_ip FROM inventory.bmc_infos"))).scalars())
    finally:
        await eng.dispose()


async def _forget(url: str, bmc_ips: set[str]) -> None:
    """Fuzzed registrations must not outlive the test: other tests reach registered nodes."""
    eng = create_async_engine(url)
    try:
        async with eng.begin() as conn:
            await conn.execute(
                sa.text("DELETE FROM inventory.bmc_infos WHERE bmc_ip = ANY(:ips)"), {"ips": list(bmc_ips)}
            )
    finally:
        await eng.dispose()


@pytest.fixture
async def system(settings, serve, emulator, tmp_path_factory) -> AsyncIterator[tuple[str, Confinement]]:
    await retire_leftover_jobs(settings.database_url)
    inventory = write_inventory(tmp_path_factory.mktemp("inventory") / "inventory.yaml", STACK_BMCS)
    cfg = ProvisionerConfig(
        cache_dir=tmp_path_factory.mktemp("cache"),
        media_dir=tmp_path_factory.mktemp("media"),
        images_dir=tmp_path_factory.mktemp("images"),
        install_method="preseed",
        mirror_host="127.0.0.1:9",  # closed: nothing is ever fetched from a mirror
        build_concurrency=1,
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=15,
        power_deadline=20,
        lease_seconds=5,
        claim_interval=1,
    )
    cfg.bmc_endpoints = EveryBmcIs(
        {
            "url": emulator.url,
            "system_id": emulator.system_ids[0],
            "username": emulator.username,
            "password": emulator.password,
        }
    )
    with Confinement() as guard:
        await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
        before = await _registered(settings.database_url)  # its migrations ran
        prov = await serve(provisioner_app(settings, cfg))
        await serve(worker_app(settings))
        gw = await serve(gateway_app(settings))
        cfg.media_url, cfg.callback_url = prov.url, gw.url
        async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=30) as c:
            for bmc, node in NODES.items():
                body = {"bmc_ip": bmc, "os_ip": node, "os_username": "root", "os_password": "fuzz-pw"}
                assert (await c.post("/controlnode/register", json=body)).status_code in (200, 201)
            assert (await c.post("/controlnode/fabric-config", json=BASE)).status_code in (200, 201)
            yield gw.url, guard
            await c.delete("/controlnode/fabric-config")
    await retire_leftover_jobs(settings.database_url)
    await _forget(settings.database_url, await _registered(settings.database_url) - before)


@pytest.mark.timeout(1200)
async def test_fuzz_gateway_no_server_errors_and_schema_conformant(system, tmp_path):
    url, guard = system
    paths = json.loads((OPENAPI / "gateway.json").read_text())["paths"].values()
    documented = sum(m in ("get", "put", "post", "patch", "delete") for ops in paths for m in ops)
    result = await run_schemathesis(
        OPENAPI / "gateway.json", url, tmp_path, headers=ADMIN, exclude=EXCLUDE, unlearned=OWN_TOKEN
    )
    refused = sorted(set(guard.refused))[:5]
    print("gateway fuzz:", result.summary(), f"; non-lab connections refused: {len(guard.refused)} {refused}")
    assert len(result.operations) == documented - 1, result.operations  # every operation but SSE ran
    assert result.generated > 1000, result.text[-3000:]
    async with httpx.AsyncClient(base_url=url, headers=ADMIN) as c:  # the run kept its credentials
        assert (await c.get("/controlnode/tokens/self")).status_code == 200
    assert (result.server_errors, result.schema_failures) == (0, 0), result.text[-20000:]
    assert result.returncode == 0, result.text[-20000:]


@pytest.mark.timeout(600)
async def test_fuzz_gateway_stateful_sequences(system, settings, serve, tmp_path):
    url, guard = system
    tokens = await serve(token_source(settings))
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=30) as c:
        doc = (await c.get("/openapi.json")).json()  # the running gateway's document, its links
    schema = tmp_path / "gateway.json"
    schema.write_text(json.dumps(doc))
    result = await run_schemathesis(
        schema,
        url,
        tmp_path,
        headers=ADMIN,
        exclude=EXCLUDE,
        unlearned=OWN_TOKEN,
        phases="stateful",
        max_time=STATEFUL_SECONDS,
        timeout=STATEFUL_SECONDS + 240,
        env={"SCHEMATHESIS_HOOKS": str(HOOKS), "KARIOS_FUZZ_TOKEN_SOURCE": tokens.url},
    )
    print(f"gateway stateful fuzz: {result.summary()}; non-lab connections refused: {len(guard.refused)}")
    assert result.links_total == len(LINKS), result.text[-3000:]  # every documented link, none inferred
    assert result.links_covered > 0, result.text[-3000:]
    async with httpx.AsyncClient(base_url=url, headers=ADMIN) as c:  # the run kept its credentials
        assert (await c.get("/controlnode/tokens/self")).status_code == 200
    assert (result.server_errors, result.schema_failures) == (0, 0), result.text[-20000:]
    assert result.returncode == 0, result.text[-20000:]


class Item(BaseModel):
    name: str
    size: int


def _broken_app() -> FastAPI:
    app = FastAPI()

    @app.get("/crash/{n}", response_model=Item)
    async def crash(n: int) -> Item:
        if n % 2:
            raise HTTPException(500, "boom")
        return Item(name="ok", size=n)

    @app.get("/lies", response_model=Item)
    async def lies() -> Item:
        return Item.model_construct(name="x", size="not a number")  # type: ignore[arg-type]

    return app


async def test_fuzz_counts_failures(serve, tmp_path):
    """The runner can fail: a 500 and a body that breaks its schema are both counted."""
    app = _broken_app()
    schema = tmp_path / "openapi.json"
    schema.write_text(json.dumps(app.openapi()))
    running = await serve(app)
    result = await run_schemathesis(schema, running.url, tmp_path, headers={}, max_examples=10)
    assert len(result.operations) == 2 and result.returncode != 0, result.text[-3000:]
    assert result.server_errors >= 1 and result.schema_failures >= 1, result.text[-5000:]


def test_largest_secrets_fit_their_ciphertext_fields():
    """Found by the fuzzer (POST /controlnode/nodes → 500): the ciphertext of a bounded secret or
    key (4-byte characters at the length limit) must be a valid contract field."""
    box = SecretBox({"k1": os.urandom(32)}, "k1")
    key, password = "\U0001d11e" * TEXT_MAX, "\U0001d11e" * SECRET_MAX
    AdoptNode(node_ip="10.0.0.1", ssh_private_key_enc=box.encrypt(key), os_password_enc=box.encrypt(password))
    RegisterNode(
        bmc_ip="10.0.0.1", bmc_password_enc=box.encrypt(password), os_password_enc=box.encrypt(password)
    )
