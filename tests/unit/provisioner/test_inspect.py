"""Out-of-band inspection over recorded BMC responses (issue 27 item 1).

Two sets of recorded responses, both from real BMCs (sources and licences in their README):

- ``tests/unit/provisioner/fixtures/redfish`` (the shared captures: service root, System, Manager
  of every vendor) — parsed directly: system identity, power state, BIOS version, BMC identity and
  vendor detection for every directory;
- ``tests/fixtures/redfish_inventory`` (full Mockup-Creator captures of a Dell R750, HPE DL385,
  Lenovo SR670 V2 and Supermicro SYS-821GE) — served by a recorded BMC and inspected by the real
  driver + collector: CPUs, DIMMs, drives, NICs, PCIe/GPUs, firmware, each vendor's quirk.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from karios.common.contracts.hardware import HardwareInspected
from karios.provisioner.drivers import DRIVERS, BmcEndpoint, RedfishDriver, driver_for
from karios.provisioner.drivers.quirks import Quirks
from karios.provisioner.drivers.tls import TlsMode
from karios.provisioner.inspect import parse
from karios.provisioner.inspect.collect import Collector
from tests.fixtures.redfish_mockup import RecordedBmc

SHARED = Path(__file__).parent / "fixtures" / "redfish"
FULL = Path(__file__).parents[2] / "fixtures" / "redfish_inventory"
IP = "10.0.0.9"


def _doc(d: Path, name: str) -> dict:
    return json.loads((d / name).read_text())


def _shared_dirs() -> list[Path]:
    """Every captured directory with a System document, in both fixture sets."""
    dirs = [*SHARED.glob("*/*"), *FULL.glob("*/*")]
    return sorted(p for p in dirs if p.is_dir() and list(p.glob("redfish__v1__Systems__*.json")))


def _system_file(d: Path) -> Path:
    return next(
        f
        for f in sorted(d.glob("redfish__v1__Systems__*.json"))
        if f.name.count("__") == 3 and "--" not in f.name
    )


@pytest.mark.parametrize(
    "d", _shared_dirs(), ids=lambda d: f"{d.parent.parent.name}:{d.parent.name}/{d.name}"
)
def test_every_shared_capture_gives_the_system_identity_and_the_vendor(d: Path) -> None:
    system = json.loads(_system_file(d).read_text())
    info = parse.system_info(system)
    assert info.redfish_id.rstrip("/").startswith("/redfish/v1/Systems/")
    for key, got in (("Model", info.model), ("SerialNumber", info.serial), ("PowerState", info.power_state)):
        assert got == (system.get(key) or "").strip(), key
    assert info.bios_version == (system.get("BiosVersion") or "").strip()
    root = _doc(d, "redfish__v1.json") if (d / "redfish__v1.json").is_file() else {}
    vendor = d.parent.name
    expected = {"generic": "generic", "cisco": "cisco"}.get(vendor, vendor)
    if vendor != "cisco":  # the Cisco fixture is authored from the documentation, not a capture
        assert parse.vendor_of(root, system) == expected
    assert parse.vendor_of(root, system) in DRIVERS
    managers = [
        f for f in d.glob("redfish__v1__Managers__*.json") if f.name.count("__") == 3 and "--" not in f.name
    ]
    for f in managers:
        bmc = parse.bmc_identity(json.loads(f.read_text()), root)
        assert bmc.id and bmc.id == json.loads(f.read_text())["Id"]


def test_vendor_detection_falls_back_to_the_oem_key_of_a_root_without_vendor() -> None:
    root = _doc(FULL / "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr", "redfish__v1.json")
    assert "Vendor" not in root and parse.vendor_of(root) == "supermicro"
    old = _doc(FULL / "supermicro/redfish-1.9.0_serviceroot_bmclib", "redfish__v1.json")
    assert "Vendor" not in old and "Product" not in old and parse.vendor_of(old) == "supermicro"
    assert parse.vendor_of({"Vendor": "HPE"}) == "hpe" and parse.vendor_of({"Vendor": "Dell"}) == "dell"
    assert parse.vendor_of({}, {"Manufacturer": "Lenovo"}) == "lenovo"
    assert parse.vendor_of({}, {"Manufacturer": "Sushy Emulator"}) == "generic"


# vendor dir → what the capture holds (checked by hand against the JSON files)
EXPECTED = {
    "dell/idrac9-6.00.30.00_poweredge-r750": dict(
        model="PowerEdge R750", serial="CNIVC0014M0388", cpus=2, mem=512.0, dimms=16, drives=3,
        drive=("Dell Ent NVMe CM6 RI 1.92TB", "61P0A06CTCD8", 1920.4, "SSD", "PCIe"),
        nics=5, gpus=[("10de", "2331")], firmware=21, bmc_fw="6.00.30.00",
    ),
    "hpe/ilo5-2.72_proliant-dl385-gen10plus-v2": dict(
        model="ProLiant DL385 Gen10 Plus v2", serial="MXQ302099S", cpus=2, mem=1024.0, dimms=16, drives=18,
        drive=("MZXLR6T4HALA-000H3", "S6C1NA0TA01511", 6401.3, "SSD", "NVMe"),
        nics=7, gpus=[], firmware=48, bmc_fw="iLO 5 v2.72",
    ),
    "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2": dict(
        model="ThinkSystem SR670 V2", serial="J105958B", cpus=2, mem=1024.0, dimms=16, drives=4,
        drive=("Micron_7450_MTFDKBA960TFR", "233442ABA3AB", 960.0, "SSD", "NVMe"),
        nics=4, gpus=[("10de", "26b5")] * 8, firmware=42, bmc_fw="TGBT42S 2.83 2023-07-05",
    ),
    "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr": dict(
        model="SYS-821GE-TNHR", serial="S889914X3710910", cpus=2, mem=2048.0, dimms=32, drives=8,
        drive=("MZQL27T6HBLA-00A07", "S6CKNN0W502286", 7681.5, "", ""),
        nics=12, gpus=[("10de", "")] * 8, firmware=106, bmc_fw="11.01.01",
    ),
}  # fmt: skip


def _driver(bmc: RecordedBmc, vendor: str, cls: type[RedfishDriver] | None = None) -> RedfishDriver:
    ep = BmcEndpoint(
        bmc_ip=IP, base_url="http://bmc.test", username="u", password="p", retries=0, tls=TlsMode.plain
    )
    return (cls or driver_for(vendor))(ep, transport=bmc.transport())


async def _inspect(where: Path, vendor: str, quirks: Quirks | None = None, bmc: RecordedBmc | None = None):
    bmc = bmc or RecordedBmc(where, username="u", password="p")
    async with _driver(bmc, vendor) as drv:
        return await Collector(drv, quirks or drv.quirks).run(IP, vendor), bmc


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_a_recorded_bmc_of_each_vendor_is_inspected_completely(name: str) -> None:
    exp = EXPECTED[name]
    vendor = name.split("/")[0]
    rec, bmc = await _inspect(FULL / name, vendor)
    assert rec.missing == [], rec.missing
    assert (rec.system.model, rec.system.serial, rec.system.power_state) == (
        exp["model"],
        exp["serial"],
        "On",
    )
    assert rec.system.bios_version and rec.bmc.firmware_version == exp["bmc_fw"]
    assert rec.processor_count == exp["cpus"] == len(rec.processors)
    assert all(p.model and p.cores for p in rec.processors)
    assert rec.memory_total_gib == exp["mem"] and len(rec.memory) == exp["dimms"]
    assert all(m.size_mib and m.slot for m in rec.memory)
    assert len(rec.drives) == exp["drives"]
    d = rec.drives[0]
    assert (d.model, d.serial, d.size_gb, d.media_type, d.protocol) == exp["drive"]
    ports = [n for n in rec.nics if not n.host_interface]
    assert len(ports) == exp["nics"] and all(len(n.mac) == 17 for n in ports)
    assert [(g.vendor_id, g.device_id) for g in rec.gpus] == exp["gpus"]
    assert len(rec.firmware) == exp["firmware"] and all(c.version for c in rec.firmware)
    # every recorded file but the AccountService ones was read: the fixture is what inspection needs
    unread = {f.name for f in (FULL / name).glob("*.json")} - {
        p.strip("/").replace("/", "__") + ".json" for p in bmc.seen
    }
    assert {u for u in unread if "AccountService" not in u and "SimpleStorage" not in u} == set()
    summary = HardwareInspected.of(rec)
    assert summary.drive_count == exp["drives"] and summary.gpu_count == len(exp["gpus"])


async def test_dell_firmware_is_what_is_installed_not_its_duplicates_or_rollback_images() -> None:
    where = FULL / "dell/idrac9-6.00.30.00_poweredge-r750"
    rec, _ = await _inspect(where, "dell")
    assert len(rec.firmware) == 21 and all(c.id.startswith("Installed-") for c in rec.firmware)
    bios = [c.version for c in rec.firmware if c.id.endswith("__BIOS.Setup.1-1")]
    assert bios == ["1.8.2"] == [rec.system.bios_version]  # not also 1.2.4, the rollback image
    raw, _ = await _inspect(where, "dell", Quirks())  # without the quirk: 29, BIOS three times
    assert len(raw.firmware) == 29


async def test_hpe_decimal_pci_ids_make_the_embedded_matrox_video_no_gpu() -> None:
    where = FULL / "hpe/ilo5-2.72_proliant-dl385-gen10plus-v2"
    rec, _ = await _inspect(where, "hpe")
    video = next(p for p in rec.pcie_devices if p.id == "222")
    assert (video.vendor_id, video.device_id, video.device_class) == ("102b", "0538", "DisplayController")
    assert not video.is_gpu and rec.gpus == []
    assert {p.pci_id for p in rec.pcie_devices if p.vendor_id == "15b3"}  # Mellanox, 5555 decimal
    raw, _ = await _inspect(where, "hpe", Quirks())  # read as hex, "4139" would be a GPU maker id
    assert next(p for p in raw.pcie_devices if p.id == "222").vendor_id == "4139"


async def test_lenovo_tomanager_is_the_host_link_to_the_xcc_not_a_port() -> None:
    rec, _ = await _inspect(FULL / "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2", "lenovo")
    to_manager = next(n for n in rec.nics if n.id == "ToManager")
    assert to_manager.host_interface and not any(n.host_interface for n in rec.nics if n.id != "ToManager")
    assert HardwareInspected.of(rec).nic_count == len(rec.nics) - 1


async def test_supermicro_gpus_get_their_vendor_from_the_oem_block() -> None:
    where = FULL / "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr"
    rec, _ = await _inspect(where, "supermicro")
    assert len(rec.gpus) == 8 and {(g.manufacturer, g.vendor_id, g.model) for g in rec.gpus} == {
        ("NVIDIA", "10de", "H100 80GB HBM3")
    }
    raw, _ = await _inspect(where, "supermicro", Quirks())
    assert {g.vendor_id for g in raw.gpus} == {""}  # 0x0000 is "not reported", never a vendor


class _NoStorage(RecordedBmc):
    """The Supermicro capture with its Storage collection gone (an older firmware)."""

    def handle(self, request: httpx.Request) -> httpx.Response:
        if "/Storage" in request.url.path and "SimpleStorage" not in request.url.path:
            return httpx.Response(404, json={"error": {"message": "not here"}})
        return super().handle(request)


async def test_without_storage_the_drives_come_from_simplestorage() -> None:
    where = FULL / "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr"
    rec, _ = await _inspect(where, "supermicro", bmc=_NoStorage(where, username="u", password="p"))
    assert len(rec.drives) == 8 and {d.source for d in rec.drives} == {"SimpleStorage"}
    assert rec.drives[0].model == "MZQL27T6HBLA-00A07" and rec.drives[0].serial == ""
    assert any(m.startswith("Storage:") for m in rec.missing)


async def test_a_bmc_offering_only_system_and_manager_gives_a_partial_record_naming_the_gaps() -> None:
    """The DMTF public-rackmount1 mockup as captured here: System and Manager, no collections."""
    where = SHARED / "generic/dmtf-public-rackmount1"
    rec, _ = await _inspect(where, "generic")
    assert rec.system.serial == "437XR1138R2" and rec.system.manufacturer == "Contoso"
    assert rec.processor_count == 2 and rec.memory_total_gib == 96  # ProcessorSummary, MemorySummary
    assert rec.bmc.id == "BMC" and rec.bmc.firmware_version
    gaps = {m.split(":")[0].split(" ")[0] for m in rec.missing}
    assert {"Processors", "Memory", "EthernetInterfaces", "PCIeDevices"} <= gaps, rec.missing
    assert rec.drives == [] and rec.nics == []


async def test_a_refused_credential_fails_the_inspection_instead_of_an_empty_record() -> None:
    bmc = RecordedBmc(FULL / "dell/idrac9-6.00.30.00_poweredge-r750", username="u", password="other")
    with pytest.raises(Exception, match="refused the credentials"):
        await _inspect(FULL / "dell/idrac9-6.00.30.00_poweredge-r750", "dell", bmc=bmc)


@pytest.mark.parametrize(
    ("raw", "decimal", "out"),
    [("0x10DE", False, "10de"), ("10de", False, "10de"), ("0x0000", False, ""), ("0xFFFF", False, ""),
     ("4139", True, "102b"), ("0x10de", True, "10de"), ("garbage", False, ""), (None, False, "")],
)  # fmt: skip
def test_pci_ids(raw, decimal, out) -> None:
    assert parse.pci_hex(raw, decimal) == out
