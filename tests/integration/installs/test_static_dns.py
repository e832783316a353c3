"""Static addressing takes the device's name servers from the inventory (issue 25 item 1): real
NATS, the file inventory service and the provisioner's own lookup (``jobs/hostctx.py``); the
pool's gateway is the name server only when the inventory names none for the device."""

from __future__ import annotations

import pytest
import yaml

from karios.api_gateway.app import create_app as gateway_app
from karios.common.contracts.provision import ProvisionSpec, StartProvision
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.install.image import ImageMethod, network_unit
from karios.provisioner.install.live import net_env
from karios.provisioner.jobs.hostctx import static_address
from tests.unit.installs.test_scripts import _cfg, _ctx

pytestmark = pytest.mark.integration


async def test_static_address_uses_the_devices_name_servers(settings, serve, tmp_path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "static_pool": {"cidr": "192.0.2.0/24", "start": "192.0.2.50", "gateway": "192.0.2.1"},
                "devices": [
                    {
                        "id": 1,
                        "name": "dns-a",
                        "oob_ip": "10.95.0.1",
                        "nameservers": ["192.0.2.53", "192.0.2.54"],
                    },
                    {"id": 2, "name": "dns-b", "oob_ip": "10.95.0.2"},
                ],
            },
            sort_keys=False,
        )
    )
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    bus = (await serve(gateway_app(settings))).app.state.runtime.bus

    def cmd(name: str, ip: str) -> StartProvision:
        spec = ProvisionSpec(bmc_ip=ip, vendor="dell", hostname=name, prefix_id=1)
        return StartProvision(job_id=f"job-{name}", spec=spec)

    a = await static_address(bus, cmd("dns-a", "10.95.0.1"))
    assert a is not None and a["gateway"] == "192.0.2.1" and a["address"].startswith("192.0.2.")
    assert a["nameservers"] == ["192.0.2.53", "192.0.2.54"]
    b = await static_address(bus, cmd("dns-b", "10.95.0.2"))
    assert b is not None and b["nameservers"] == ["192.0.2.1"]  # none in the inventory: the gateway

    # Both reach the live environment and the installed system.
    ctx = _ctx(static=a, nameservers=[])
    assert "NET_DNS='192.0.2.53 192.0.2.54'" in net_env("", a, [])
    assert "DNS=192.0.2.53" in network_unit(ctx) and "DNS=192.0.2.54" in network_unit(ctx)
    script = ImageMethod(_cfg(tmp_path)).render_install_script(ctx)
    assert "printf 'nameserver %s\\n' 192.0.2.53 192.0.2.54 > $T/etc/resolv.conf" in script
