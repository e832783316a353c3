"""Issue 27 item 4 through the real gateway and provisioner (real NATS, PostgreSQL) on sushy-tools:
a provision with ``gpu_passthrough`` sets virtualization + iommu in the BIOS before the job's one
reset, the reset applies them, the job reads them back and says which attributes it set.

Where the emulator stops: sushy-tools 2.2.0 serves ``/redfish/v1/Systems/<id>/BIOS`` and
``BIOS/Settings`` (GET, PATCH) only for drivers that implement ``get_bios``/``set_bios`` — the
libvirt driver does, the fake driver the lab uses does not (``BIOS`` answers "not supported" and
the System has no ``Bios`` link). :data:`FAKE_BIOS` gives the fake driver the libvirt driver's two
methods over a ``bios`` dict per fake system, with one difference that real BMCs have and the
libvirt driver lacks: a PATCH is *pending* until the next reset (as iDRAC/iLO/XCC do with
``@Redfish.SettingsApplyTime: OnReset``), so the test proves the settings came with the job's reset.
The emulator's routes, templates and PATCH handling are sushy-tools' own.
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import resets_seen, wait_job, wait_resets
from tests.fixtures.wait import wait_until
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]

FAKE_BIOS = """\
import sys as _sys
from sushy_tools import error as _error
from sushy_tools.emulator.resources.systems import fakedriver as _fd

def _get_bios(self, identity):
    bios = self._get(identity).get("bios")
    if bios is None:
        raise _error.NotSupportedError("fake system has no bios")
    return dict(bios)

def _set_bios(self, identity, attributes):
    system = self._get(identity)
    if system.get("bios") is None:
        raise _error.NotSupportedError("fake system has no bios")
    pending = dict(system.get("bios_pending") or {})
    pending.update(attributes or {})
    self._update(system, bios_pending=pending)
    print(f"karios-bios pending {identity} {sorted(pending)}", file=_sys.stderr, flush=True)

_set_power = _fd.FakeDriver.set_power_state

def _set_power_state(self, identity, state):
    _set_power(self, identity, state)
    system = self._get(identity)
    pending = system.get("bios_pending")
    if pending and ("On" in state or "Restart" in state or state == "PowerCycle"):
        self._update(system, bios={**system["bios"], **pending}, bios_pending={})
        print(f"karios-bios applied {identity} {sorted(pending)} on {state}", file=_sys.stderr, flush=True)

_fd.FakeDriver.get_bios = _get_bios
_fd.FakeDriver.set_bios = _set_bios
_fd.FakeDriver.set_power_state = _set_power_state
"""
OFF = {
    "ProcVirtualization": "Disabled",
    "IntelProcVtd": "Disabled",
    "Sriov": "Enabled",
    "BootMode": "Uefi",
    "NicBoot1": "NetworkBoot",
}
NO_IOMMU = {"ProcVirtualization": "Enabled", "BootMode": "Uefi"}  # a BIOS without a VT-d setting


@pytest.fixture(scope="module")
def emulator():
    """Overrides the conftest's: five systems (the stack's BMCs), the first two with a BIOS."""
    systems = [fake_system("bios1", bios=dict(OFF)), fake_system("bios2", bios=dict(NO_IOMMU))]
    systems += [fake_system(f"bios{i}") for i in range(3, 6)]
    try:
        emu = RedfishEmulator(systems, auth=True, prelude=FAKE_BIOS).start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


def body(ip: str, **fields) -> dict:
    return {"bmc_IP": ip, "vendor": "generic", "hostname": "gpu1", "selected_disks": ["sda"], **fields}


async def _message(c: httpx.AsyncClient, job_id: str, prefix: str) -> str:
    async def read() -> str | None:
        msg = (await c.get(f"/controlnode/job/{job_id}", headers=ADMIN)).json()["message"]
        return msg if msg.startswith(prefix) else None

    return await wait_until(read, timeout=60, interval=0.2, what=f"job message {prefix!r}")  # type: ignore[no-any-return]


async def test_gpu_passthrough_sets_vt_and_vtd_before_the_one_reset_and_reads_them_back(stack) -> None:
    emu, sid, ip = stack.emu, stack.emu.system_ids[0], stack.bmc_ips[0]
    bios = emu.get(f"/redfish/v1/Systems/{sid}/BIOS")  # sushy-tools' own route and template
    assert bios["Attributes"]["ProcVirtualization"] == "Disabled"
    assert emu.get(f"/redfish/v1/Systems/{sid}")["Bios"]["@odata.id"].endswith("/BIOS")
    since = len(emu.log())
    async with httpx.AsyncClient(base_url=stack.gw, timeout=60) as c:
        r = await c.post("/controlnode/provision", json=body(ip, gpu_passthrough=True), headers=ADMIN)
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        await wait_job(c, job_id, {"booting"}, timeout=180)
        assert await wait_resets(emu, sid, since) == 1  # the job's one reset: no extra reboot
        message = await _message(c, job_id, "BIOS read back after the reset")
        progress = (
            await c.post("/controlnode/provision/progress/all", json={"bmc_ip": ip}, headers=ADMIN)
        ).json()

    assert message == (
        "BIOS read back after the reset: set ProcVirtualization=Enabled, IntelProcVtd=Enabled; "
        "all 2 attribute(s) as wanted"
    )
    # at the reset the job said what it was setting (and that it rides on this reset)
    at_reset = [p["message"] for p in progress if p["message"].startswith("Medium mounted")]
    assert (
        at_reset
        and "BIOS (virtualization, iommu): set ProcVirtualization=Enabled, IntelProcVtd=Enabled on this reset"
        in at_reset[-1]
    )
    # the emulator's BIOS after the job's reset
    after = emu.get(f"/redfish/v1/Systems/{sid}/BIOS")["Attributes"]
    assert after == {**OFF, "ProcVirtualization": "Enabled", "IntelProcVtd": "Enabled"}
    # only what differed was PATCHed, before the reset, and the reset applied it
    log = emu.log()[since:]
    pending = log.index(f"karios-bios pending {sid} ['IntelProcVtd', 'ProcVirtualization']")
    applied = re.search(rf"karios-bios applied {sid} \['IntelProcVtd', 'ProcVirtualization'\] on (\w+)", log)
    assert applied is not None and pending < applied.start(), log[-2000:]
    assert resets_seen(emu, sid, since) == 1


async def test_a_bios_without_the_iommu_setting_is_reported_with_a_warning_not_a_failure(stack) -> None:
    emu, sid, ip = stack.emu, stack.emu.system_ids[1], stack.bmc_ips[1]
    since = len(emu.log())
    async with httpx.AsyncClient(base_url=stack.gw, timeout=60) as c:
        r = await c.post("/controlnode/provision", json=body(ip, gpu_passthrough=True), headers=ADMIN)
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        await wait_job(c, job_id, {"booting"}, timeout=180)
        message = await _message(c, job_id, "BIOS read back")
        progress = (
            await c.post("/controlnode/provision/progress/all", json={"bmc_ip": ip}, headers=ADMIN)
        ).json()
    at_reset = [p["message"] for p in progress if p["message"].startswith("Medium mounted")]
    assert "already as wanted: ProcVirtualization=Enabled; not on this BIOS: iommu" in at_reset[-1]
    assert message.startswith("BIOS read back after the reset; all 1 attribute(s) as wanted")
    assert "WARNING: gpu_passthrough needs iommu but this generic BIOS has no attribute for it" in message
    assert "karios-bios pending" not in emu.log()[since:]  # ProcVirtualization already Enabled: no PATCH
    assert emu.get(f"/redfish/v1/Systems/{sid}/BIOS")["Attributes"] == NO_IOMMU
