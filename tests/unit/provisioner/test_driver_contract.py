"""One contract every BMC driver passes against recorded vendor responses (fixtures/redfish)."""

from __future__ import annotations

import pytest

from karios.common.errors import PermanentFailure, UpstreamError
from karios.provisioner.drivers import DRIVERS, QUIRKS, BmcEndpoint, driver_for
from karios.provisioner.drivers.redfish import RedfishDriver
from tests.unit.provisioner.fakebmc import FIXTURES, FakeBmc

IMAGE = "http://10.0.0.1:8082/media/job-1.iso"

CASES = [
    ("generic", "generic/dmtf-public-rackmount1"),
    ("dell", "dell/idrac9-6.00.30.00_poweredge-r750"),
    ("dell", "dell/idrac9-7.10.30.00_poweredge-r750"),
    ("hpe", "hpe/ilo5-2.46_proliant-dl325-gen10plus"),
    ("hpe", "hpe/ilo5-2.70_proliant-xl675d-gen10plus"),
    ("hpe", "hpe/ilo5-2.72_proliant-dl385-gen10plus-v2"),
    ("lenovo", "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2"),
    ("supermicro", "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr"),
    ("cisco", "cisco/cimc-4.x_documented"),
]
# Properties a firmware rejects in InsertMedia (Cisco: as documented; see the fixture README).
REJECTS = {"cisco": frozenset({"Inserted", "WriteProtected"})}


def make(vendor: str, fixture: str) -> tuple[RedfishDriver, FakeBmc]:
    bmc = FakeBmc(fixture, reject_params=REJECTS.get(vendor, frozenset()))
    ep = BmcEndpoint(
        bmc_ip="10.0.0.5",
        base_url="https://10.0.0.5",
        username="admin",
        password="pw-s3cret",
        retries=1,
        backoff=0.0,
        power_deadline=2,
    )
    return driver_for(vendor)(ep, transport=bmc.transport()), bmc


@pytest.mark.parametrize("preinserted", [False, True], ids=["empty", "inserted"])
@pytest.mark.parametrize(("vendor", "fixture"), CASES, ids=[c[1].split("/")[1] for c in CASES])
async def test_driver_mounts_boots_and_cleans_up(vendor, fixture, preinserted):
    drv, bmc = make(vendor, fixture)
    async with drv:
        if preinserted:
            sys_uri = await drv.system_uri()
            slot_uri, _ = await drv.cd_slot(sys_uri)
            bmc.insert_into(slot_uri, "http://old/medium.iso")
        slot_uri = await drv.mount(IMAGE)
        assert bmc.doc(slot_uri)["Image"] == IMAGE  # what the BMC reports, read back
        assert any(t in bmc.doc(slot_uri)["MediaTypes"] for t in ("CD", "DVD"))
        if preinserted:
            ejected = [
                w for w in bmc.writes if "Eject" in w[1] or (w[0] == "PATCH" and w[2].get("Image") is None)
            ]
            assert ejected, "an inserted medium is ejected before inserting ours"
        await drv.set_boot_cd_once()
        sys_doc = bmc.doc(await drv.system_uri())
        assert sys_doc["Boot"]["BootSourceOverrideTarget"] == "Cd"
        assert sys_doc["Boot"]["BootSourceOverrideEnabled"] == "Once"
        kind = await drv.reset_into_media()
        assert kind in ("On", "ForceRestart", "PowerCycle", "ForceOn")
        await drv.wait_power_on()
        await drv.unmount()
        await drv.clear_boot_override()
        assert not bmc.doc(slot_uri).get("Image")
        assert sys_doc["Boot"]["BootSourceOverrideTarget"] == "None"
    # The password goes to the session login only, never into another request body.
    assert all("pw-s3cret" not in str(w) for w in bmc.writes if not w[1].endswith("/Sessions"))


async def test_lenovo_inserts_by_patch_because_xcc_has_no_actions():
    drv, bmc = make("lenovo", "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2")
    async with drv:
        slot = await drv.mount(IMAGE)
    assert slot.endswith("/EXT1")
    assert ("PATCH", slot, {"Image": IMAGE, "Inserted": True}) in bmc.writes


async def test_generic_driver_on_xcc_would_pick_a_remote_slot_lenovo_does_not():
    drv, _ = make("lenovo", "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2")
    async with drv:
        uri, _slot = await drv.cd_slot(await drv.system_uri())
    assert uri.rsplit("/", 1)[-1].startswith("EXT")


async def test_supermicro_sends_only_actioninfo_parameters_and_skips_empty_eject():
    drv, bmc = make("supermicro", "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr")
    async with drv:
        await drv.mount(IMAGE)
    inserts = [w for w in bmc.writes if w[1].endswith("InsertMedia")]
    assert len(inserts) == 1 and set(inserts[0][2]) <= {
        "Image",
        "Inserted",
        "WriteProtected",
        "TransferProtocolType",
        "TransferMethod",
    }
    assert not [w for w in bmc.writes if "Eject" in w[1]]


async def test_cisco_omits_properties_cimc_rejects():
    drv, bmc = make("cisco", "cisco/cimc-4.x_documented")
    async with drv:
        await drv.mount(IMAGE)
    insert = next(w for w in bmc.writes if w[1].endswith("InsertMedia"))
    assert "Inserted" not in insert[2] and "WriteProtected" not in insert[2]
    # The generic driver sends them and the (documented) CIMC refuses: a clear error, not a crash.
    ep = BmcEndpoint(bmc_ip="10.0.0.5", base_url="https://x", retries=0)
    generic = RedfishDriver(
        ep, transport=FakeBmc("cisco/cimc-4.x_documented", reject_params=REJECTS["cisco"]).transport()
    )
    async with generic:
        with pytest.raises(Exception, match="PropertyUnknown"):
            await generic.mount(IMAGE)


async def test_hpe_trailing_slashes_are_followed():
    drv, bmc = make("hpe", "hpe/ilo5-2.70_proliant-xl675d-gen10plus")
    async with drv:
        slot = await drv.mount(IMAGE)
    assert not slot.endswith("/") and bmc.doc(slot)["Image"] == IMAGE


async def test_old_idrac_has_virtual_media_only_under_the_manager():
    drv, _ = make("dell", "dell/idrac9-3.x-4.x_poweredge-r640_sushy-oem-samples")
    async with drv:  # this capture has no Systems collection: start from the System itself
        colls = await drv.virtual_media_collections("/redfish/v1/Systems/System.Embedded.1")
    assert colls == ["/redfish/v1/Managers/iDRAC.Embedded.1/VirtualMedia"]


async def test_dell_prefers_the_system_path_over_the_deprecated_manager_path():
    drv, _ = make("dell", "dell/idrac9-7.10.30.00_poweredge-r750")
    async with drv:
        colls = await drv.virtual_media_collections(await drv.system_uri())
    assert colls[0] == "/redfish/v1/Systems/System.Embedded.1/VirtualMedia"


async def test_read_back_mismatch_is_an_upstream_error():
    drv, bmc = make("generic", "generic/dmtf-public-rackmount1")
    bmc.report_image = "http://someone-else/x.iso"
    async with drv:
        with pytest.raises(UpstreamError, match="reports Image"):
            await drv.mount(IMAGE)


async def test_hpe_early_ilo5_inserts_with_the_oem_action():
    bmc = FakeBmc("hpe/ilo5-1.1x_proliantutils-samples")
    ep = BmcEndpoint(bmc_ip="10.0.0.5", base_url="https://x", retries=0)
    drv = driver_for("hpe")(ep, transport=bmc.transport())
    async with drv:
        slot = bmc.doc("/redfish/v1/Managers/1/VirtualMedia/2")
        await drv.insert("/redfish/v1/Managers/1/VirtualMedia/2", slot, IMAGE)
    assert bmc.writes[-1][1].endswith("HpeiLOVirtualMedia.InsertVirtualMedia")
    assert bmc.doc("/redfish/v1/Managers/1/VirtualMedia/2")["Image"] == IMAGE


def test_every_vendor_has_a_driver_and_every_quirk_names_evidence_and_a_fixture():
    assert {"dell", "hp", "hpe", "lenovo", "supermicro", "cisco", "generic"} <= set(DRIVERS)
    dirs = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.glob("*/*") if p.is_dir()}
    for row in QUIRKS:
        assert row.evidence and row.firmware and row.fixture
        first = row.fixture.split(",")[0].split(" ")[0].split("/…")[0].rstrip("_…")
        first = "/".join(first.split("/")[:2])
        assert any(d.startswith(first) for d in dirs), row


async def _job_flow(drv: RedfishDriver) -> str:
    """What a job does with its one driver: probe (find the system), mount, boot override, reset,
    power on."""
    await drv.system_uri()
    await drv.mount(IMAGE)
    await drv.set_boot_cd_once()
    kind = await drv.reset_into_media()
    await drv.wait_power_on()
    return kind


@pytest.mark.parametrize(("vendor", "fixture"), CASES, ids=[c[1].split("/")[1] for c in CASES])
async def test_a_job_reads_each_resource_once_and_the_system_three_times(vendor, fixture):
    """Discovery is kept for the driver's life: the service root and the Systems collection are
    read once, the system three times (discovery, the boot override's read-back, the power poll),
    and an InsertMedia answered 204 is not read back (a PATCH insert is)."""
    drv, bmc = make(vendor, fixture)
    async with drv:
        kind = await _job_flow(drv)
        sys_uri = await drv.system_uri()
    assert kind in ("On", "ForceRestart", "PowerCycle", "ForceOn")
    assert bmc.gets("/redfish/v1") == 1 and bmc.gets("/redfish/v1/Systems") == 1
    assert bmc.gets(sys_uri) == 3, bmc.requests
    slot = next(p for p, d in bmc.slots().items() if d.get("Image") == IMAGE)
    inserts = [w for w in bmc.writes if "Insert" in w[1] or (w[0] == "PATCH" and w[2].get("Image") == IMAGE)]
    ejects = [
        w
        for w in bmc.writes
        if "Eject" in w[1] or (w[0] == "PATCH" and "Image" in w[2] and not w[2]["Image"])
    ]
    by_patch = inserts[0][0] == "PATCH"
    # found; + read again after an eject (the mockup had a medium in); + read back after a PATCH
    assert bmc.gets(slot) == 1 + len(ejects) + by_patch, bmc.requests
    assert len(bmc.requests) <= 14, bmc.requests


async def test_an_insert_answered_202_is_read_back_and_checked():
    """202: the BMC runs the insert as a task; only the read-back tells what it holds."""
    bmc = FakeBmc("dell/idrac9-6.00.30.00_poweredge-r750", insert_status=202)
    bmc.report_image = "http://someone-else/x.iso"
    ep = BmcEndpoint(bmc_ip="10.0.0.5", base_url="https://x", retries=0)
    async with driver_for("dell")(ep, transport=bmc.transport()) as drv:
        with pytest.raises(UpstreamError, match="reports Image"):
            await drv.mount(IMAGE)
    ok = FakeBmc("dell/idrac9-6.00.30.00_poweredge-r750", insert_status=202)
    async with driver_for("dell")(ep, transport=ok.transport()) as drv:
        slot = await drv.mount(IMAGE)
    assert ok.gets(slot) == 2  # found, then read back


async def test_reset_kind_follows_the_power_state_read_back_after_the_boot_override():
    drv, bmc = make("dell", "dell/idrac9-6.00.30.00_poweredge-r750")
    async with drv:
        sys_uri = await drv.system_uri()
        await drv.mount(IMAGE)
        bmc.doc(sys_uri)["PowerState"] = "Off"  # changed after discovery, before the override
        await drv.set_boot_cd_once()
        assert await drv.reset_into_media() == "On"
    drv, bmc = make("dell", "dell/idrac9-6.00.30.00_poweredge-r750")
    async with drv:
        sys_uri = await drv.system_uri()
        bmc.doc(sys_uri)["PowerState"] = "On"
        await drv.set_boot_cd_once()
        assert await drv.reset_into_media() == "ForceRestart"


async def test_one_session_per_job_and_a_new_login_when_the_bmc_forgot_it():
    """The probe's session goes on to the mount; a BMC that ended it (idle timeout, BMC restart)
    answers 401 once, the driver logs in again and the job goes on; the session is closed at the end."""
    bmc = FakeBmc("dell/idrac9-6.00.30.00_poweredge-r750", sessions=True)
    ep = BmcEndpoint(
        bmc_ip="10.0.0.5",
        base_url="https://x",
        username="admin",
        password="pw-s3cret",
        timeout=30.0,
        retries=3,
        connect_timeout=5.0,  # the probe's limits for reaching the BMC
        connect_retries=1,
    )
    drv = driver_for("dell")(ep, transport=bmc.transport())
    await drv.system_uri()  # the probe
    assert drv.client.timeout.connect == 5.0 and drv.client.timeout.read == 30.0
    bmc.end_sessions()  # e.g. the medium took long to build
    drv.relax()
    async with drv:
        await drv.mount(IMAGE)
        await drv.set_boot_cd_once()
        await drv.reset_into_media()
    assert bmc.logins == 2 and not bmc.tokens  # re-login once; the session deleted at close
    assert drv.client.timeout.read == 30.0 and drv.ep.retries == 3
    assert drv.client.timeout.connect == 30.0 and drv.ep.connect_retries is None
    # A BMC that forgets every session at once: one new login, then a clear failure (no loop).
    forgets = FakeBmc("dell/idrac9-6.00.30.00_poweredge-r750", sessions=True)
    drv = driver_for("dell")(ep, transport=forgets.transport())
    async with drv:
        await drv.system_uri()
        forgets.end_sessions()
        forgets.keep_sessions = False
        with pytest.raises(PermanentFailure, match="refused the credentials"):
            await drv.mount(IMAGE)
    assert forgets.logins == 2
