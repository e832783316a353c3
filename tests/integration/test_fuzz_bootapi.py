"""Fuzz the live bootapi from its published OpenAPI document (schemathesis, issue 12).

bootapi and the real inventory service (a file inventory holding the bootapi test hosts: two
bootable, one gated, one without a supported OS) run in-process on the real NATS and PostgreSQL;
schemathesis sends the provision token, so ``POST /provisioned/{ident}`` is exercised past auth.
Checks: no 5xx, every response conforms to its documented schema.
"""

from __future__ import annotations

import pytest
import yaml

from karios.bootapi.app import create_app as bootapi_app
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.bootapi import TOKEN, boot_settings
from tests.fixtures.bootapi_hosts import HOSTS
from tests.fixtures.fuzz import OPENAPI, run_schemathesis

pytestmark = pytest.mark.slow  # minutes of real servers: not in -m quick


@pytest.fixture
async def bootapi_url(settings, serve, tmp_path_factory) -> str:
    inventory = tmp_path_factory.mktemp("inventory") / "inventory.yaml"
    devices = [h.model_dump(mode="json", exclude_defaults=True) for h in HOSTS]
    inventory.write_text(yaml.safe_dump({"devices": devices}, sort_keys=False))
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    return (await serve(bootapi_app(settings, boot_settings()))).url


@pytest.mark.timeout(900)
async def test_fuzz_bootapi_no_server_errors_and_schema_conformant(bootapi_url, tmp_path):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    result = await run_schemathesis(
        OPENAPI / "bootapi.json", bootapi_url, tmp_path, headers=auth, max_examples=60
    )
    print("bootapi fuzz:", result.summary())
    assert len(result.operations) >= 7, result.operations  # the document was read, every operation ran
    assert result.generated > 100, result.text[-3000:]
    assert (result.server_errors, result.schema_failures) == (0, 0), result.text[-20000:]
    assert result.returncode == 0, result.text[-20000:]
