"""Discovery of unknown servers (issue 27 item 3), the pure parts: the discovery token, the report
the live environment sends (read by its contract, 422s naming the field), the discovered server it
becomes (the hardware record's shapes, placeholder serials dropped, the BMC's VGA not a GPU), what
adoption asks the operator to add, and the overlay with the discovery script — whose report is
built here from a sysfs tree of a two-socket server under dash and busybox sh with mawk, gawk and
busybox awk (the live environment itself: ``tests/integration/installs/test_discovery_live.py``)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from karios.common.contracts.discovery import DiscoveryReport
from karios.common.discovery_token import DiscoveryTokenExpired, DiscoveryTokenInvalid, DiscoveryTokens
from karios.provisioner.inspect.discovery import (
    default_hostname,
    discovered_server,
    hardware_digest,
    machine_serial,
    netbox_device,
    next_steps,
)
from karios.provisioner.install.live.discovery import (
    discovery_overlay_image,
    render_discovery_script,
    report_url,
)
from karios.provisioner.media.cpio import read_newc
from tests.fixtures.apps import REQUIRE

TOKENS = DiscoveryTokens({"k1": b"1" * 32, "k0": b"0" * 32}, "k1")
NOW = 1_800_000_000.0
MAC = "b8:ce:f6:01:02:03"
AT = "2026-12-05T01:00:00Z"

#: What the live environment reports on a Dell R750 with a GPU (shape of discover.sh's output).
REPORT = {
    "agent": "karios-discovery/1",
    "boot_mac": MAC,
    "ip": "10.20.0.99",
    "kernel": "6.1.0-28-amd64",
    "dmi": {
        "sys_vendor": "Dell Inc.",
        "product_name": "PowerEdge R750",
        "product_serial": "7XK1MN3",
        "product_uuid": "4C4C4544-0058-4B10-8031-B7C04F4D4E33",
        "board_serial": ".7XK1MN3.CNFCP0012300AB.",
        "chassis_serial": "7XK1MN3",
        "bios_vendor": "Dell Inc.",
        "bios_version": "1.8.2",
    },
    "cpu_model": "Intel(R) Xeon(R) Gold 6354 CPU @ 3.00GHz",
    "cpu_threads": 72,
    "memory_mib": 257_614,
    "disks": [
        {"name": "nvme0n1", "size_bytes": 1_600_321_314_816, "model": "Dell Ent NVMe P5600 MU U.2 1.6TB",
         "serial": "PHAB123400AB1P6AGN", "rotational": False, "removable": False, "transport": "nvme"},
        {"name": "sda", "size_bytes": 480_103_981_056, "model": "MZ7L3480HCHQAD3", "serial": "S6M1NE0T123456",
         "rotational": False, "removable": False, "transport": "sata"},
        {"name": "sdb", "size_bytes": 2_400_476_553_216, "model": "ST2400MM0129", "serial": "WBN1ABCD",
         "rotational": True, "removable": False, "transport": "sas"},
    ],
    "nics": [
        {"name": "ens1f0np0", "mac": "B8:CE:F6:01:02:03", "link": "up", "speed_mbps": 25000,
         "driver": "mlx5_core", "physical": True},
        {"name": "ens1f1np1", "mac": "b8:ce:f6:01:02:04", "link": "down", "speed_mbps": None,
         "driver": "mlx5_core", "physical": True},
        {"name": "eno8303", "mac": "c4:cb:e1:aa:bb:01", "link": "up", "speed_mbps": 1000,
         "driver": "tg3", "physical": True},
        {"name": "usb0", "mac": "c4:cb:e1:aa:bb:ff", "link": "unknown", "speed_mbps": None,
         "driver": "cdc_ether", "physical": False},
    ],
    "pci": [
        {"address": "0000:03:00.0", "vendor_id": "1a03", "device_id": "2000", "class_code": "030000"},
        {"address": "0000:31:00.0", "vendor_id": "15b3", "device_id": "101d", "class_code": "020000",
         "driver": "mlx5_core"},
        {"address": "0000:ca:00.0", "vendor_id": "10de", "device_id": "20b5", "class_code": "030200",
         "subsystem_vendor_id": "10de", "subsystem_device_id": "1533", "driver": "nvidia"},
    ],
}  # fmt: skip


def report(**changes) -> DiscoveryReport:  # type: ignore[no-untyped-def]
    return DiscoveryReport.model_validate({**json.loads(json.dumps(REPORT)), **changes})


# -- the token -----------------------------------------------------------------------------------


def test_a_token_names_its_mac_until_it_expires():
    token = TOKENS.issue("B8-CE-F6-01-02-03", now=NOW, ttl=900)
    assert token.startswith("k1.b8cef6010203.") and len(token) < 80
    assert TOKENS.verify(token, now=NOW + 900) == MAC
    with pytest.raises(DiscoveryTokenExpired):
        TOKENS.verify(token, now=NOW + 901)


def test_a_token_from_a_retired_key_still_verifies_and_a_forged_one_does_not():
    old = DiscoveryTokens(TOKENS.keys, "k0").issue(MAC, now=NOW)
    assert TOKENS.verify(old, now=NOW) == MAC  # a key rotation does not cut a boot short
    kid, mac, expires, sig = TOKENS.issue(MAC, now=NOW).split(".")
    forged = [
        f"{kid}.b8cef6010204.{expires}.{sig}",  # another MAC
        f"{kid}.{mac}.{int(expires) + 3600}.{sig}",  # a longer life
        f"k9.{mac}.{expires}.{sig}",  # a key not in the ring
        f"{kid}.{mac}.{expires}.{sig[:-1]}A" if sig[-1] != "A" else f"{kid}.{mac}.{expires}.{sig[:-1]}B",
        DiscoveryTokens({"k1": b"2" * 32}, "k1").issue(MAC, now=NOW),  # another installation's key
        "",
        None,
        "k1.b8cef6010203.1800000000." + "A" * 2000,
    ]
    for token in forged:
        with pytest.raises(DiscoveryTokenInvalid):
            TOKENS.verify(token, now=NOW)


# -- the report ----------------------------------------------------------------------------------


def test_the_report_becomes_a_discovered_server_in_the_hardware_record_shapes():
    server = discovered_server("id-1", MAC, report(), first_seen=AT, last_seen=AT)
    assert server.status == "discovered" and server.serial == "7XK1MN3"
    s = server.system
    assert (s.manufacturer, s.model, s.uuid, s.bios_version) == (
        "Dell Inc.",
        "PowerEdge R750",
        "4c4c4544-0058-4b10-8031-b7c04f4d4e33",
        "1.8.2",
    )
    assert [(d.name, d.protocol, d.media_type, d.size_gb) for d in server.drives] == [
        ("nvme0n1", "NVMe", "SSD", 1600.3),
        ("sda", "SATA", "SSD", 480.1),
        ("sdb", "SAS", "HDD", 2400.5),
    ]
    assert server.drives[0].serial == "PHAB123400AB1P6AGN" and server.drives[0].source == "in-band"
    # Physical NICs only (the iDRAC's USB NIC is not a port), MACs normalised.
    assert [(n.name, n.mac, n.link_status, n.speed_mbps) for n in server.nics] == [
        ("ens1f0np0", "b8:ce:f6:01:02:03", "LinkUp", 25000),
        ("ens1f1np1", "b8:ce:f6:01:02:04", "LinkDown", None),
        ("eno8303", "c4:cb:e1:aa:bb:01", "LinkUp", 1000),
    ]
    assert [(p.id, p.device_class, p.manufacturer) for p in server.pcie_devices] == [
        ("0000:03:00.0", "DisplayController", "ASPEED"),
        ("0000:31:00.0", "NetworkController", "Mellanox"),
        ("0000:ca:00.0", "DisplayController", "NVIDIA"),
    ]
    assert [g.pci_id for g in server.gpus] == ["10de:20b5"]  # the BMC's ASPEED VGA is no GPU
    assert (server.processor_threads, server.memory_mib, server.ip) == (72, 257_614, "10.20.0.99")


@pytest.mark.parametrize(
    ("dmi", "serial"),
    [
        ({"product_serial": "To Be Filled By O.E.M.", "chassis_serial": "CH-42"}, "CH-42"),
        ({"product_serial": " Default string ", "chassis_serial": "", "board_serial": "BRD9"}, "BRD9"),
        ({"product_serial": "System Serial Number", "chassis_serial": "0", "board_serial": "None"}, ""),
        ({"product_serial": "  ABC  123 "}, "ABC 123"),
    ],
)
def test_a_placeholder_serial_tells_no_machine_apart(dmi, serial):
    assert machine_serial(report(dmi={**REPORT["dmi"], **dmi})) == serial


def test_what_counts_as_new_hardware():
    base = hardware_digest(report())
    nics = json.loads(json.dumps(REPORT["nics"]))
    nics[1].update(link="up", speed_mbps=25000)  # a cable plugged in
    assert hardware_digest(report(ip="10.20.0.7", kernel="6.1.0-30-amd64", nics=nics)) == base
    disks = [*REPORT["disks"], {"name": "nvme1n1", "size_bytes": 10**12, "transport": "nvme"}]
    assert hardware_digest(report(disks=disks)) != base


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"disks": [{"name": "sda", "size_bytes": -1}]}, ("disks", 0, "size_bytes")),
        ({"disks": [{"name": "a b", "size_bytes": 1}]}, ("disks", 0, "name")),
        ({"disks": [{"name": "sda", "size_bytes": 1}, {"name": "sda", "size_bytes": 2}]}, ("disks",)),
        ({"disks": [{"name": "sda", "size_bytes": 1, "transport": "floppy"}]}, ("disks", 0, "transport")),
        ({"nics": [{"name": "eth0", "mac": "not-a-mac"}]}, ("nics", 0, "mac")),
        ({"nics": [{"name": "eth0", "mac": MAC, "speed_mbps": -1}]}, ("nics", 0, "speed_mbps")),
        ({"pci": [{"address": "0000:03:00.0", "vendor_id": "0x1a03", "device_id": "2000",
                   "class_code": "030000"}]}, ("pci", 0, "vendor_id")),
        ({"pci": [{"address": "03:00.0", "vendor_id": "1a03", "device_id": "2000",
                   "class_code": "030000"}]}, ("pci", 0, "address")),
        ({"dmi": {"product_serial": "x" * 257}}, ("dmi", "product_serial")),
        ({"disks": [{"name": f"d{i}", "size_bytes": 1} for i in range(257)]}, ("disks",)),
        ({"memory_mib": "lots"}, ("memory_mib",)),
    ],
    ids=["negative-size", "disk-name", "disk-twice", "transport", "mac", "speed", "pci-0x", "pci-address",
         "long-dmi", "too-many-disks", "memory"],
)  # fmt: skip
def test_a_bad_report_is_refused_naming_the_field(change, where):
    with pytest.raises(ValidationError) as exc:
        report(**change)
    assert exc.value.errors()[0]["loc"][: len(where)] == where


# -- adoption ------------------------------------------------------------------------------------


def test_adoption_asks_for_a_planned_netbox_device_with_the_reported_interfaces():
    server = discovered_server("id-1", MAC, report(), first_seen=AT, last_seen=AT)
    assert default_hostname(server) == "srv-7xk1mn3"
    no_serial = server.model_copy(update={"serial": ""})
    assert default_hostname(no_serial) == "srv-b8cef6010203"
    device = netbox_device(server, "r750-01")
    assert device.model_dump() == {
        "name": "r750-01",
        "status": "planned",
        "serial": "7XK1MN3",
        "manufacturer": "Dell Inc.",
        "model": "PowerEdge R750",
        "interfaces": [
            {"name": "ens1f0np0", "type": "25gbase-x-sfp28", "mac_address": MAC, "mgmt_only": False},
            {"name": "ens1f1np1", "type": "other", "mac_address": "b8:ce:f6:01:02:04", "mgmt_only": False},
            {"name": "eno8303", "type": "1000base-t", "mac_address": "c4:cb:e1:aa:bb:01", "mgmt_only": False},
        ],
        "custom_fields": {"pxe_enabled": False},
    }
    steps = next_steps(server, device, written=False)
    assert "Create the NetBox device 'r750-01' (status planned" in steps[0] and MAC in steps[0]
    assert "POST /controlnode/register" in steps[1]
    assert not any("Create the NetBox" in s for s in next_steps(server, device, written=True))


# -- the overlay and the script --------------------------------------------------------------------


def test_the_overlay_holds_the_script_with_the_token_and_dhcp_on_the_boot_nic():
    token = TOKENS.issue(MAC, now=NOW)
    url = report_url("http://10.0.0.1:8080/controlnode/")
    assert url == "http://10.0.0.1:8080/controlnode/discovery/report"
    files = read_newc(gzip.decompress(discovery_overlay_image(url, token, MAC.upper(), ["10.0.0.53"])))
    assert set(files) == {"karios/run.sh", "karios/net.env"}
    script = files["karios/run.sh"].decode()
    assert script.startswith("#!/bin/sh\n")
    assert f"URL={url}\n" in script and f"TOKEN={token}\n" in script and f"BOOT_MAC={MAC}\n" in script
    assert files["karios/net.env"].decode().splitlines() == [
        "NET_MODE=dhcp",
        f"NET_MAC={MAC}",
        "NET_DNS=10.0.0.53",
    ]


SHELLS = ("dash", "busybox")
AWKS = ("mawk", "gawk", "busybox")


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed (tests/lab/setup.sh installs them in CI)"
        pytest.fail(reason) if REQUIRE else pytest.skip(reason)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_script_parses_under_the_live_environments_shells(shell: str, tmp_path: Path):
    _need(shell)
    script = tmp_path / "run.sh"
    script.write_text(render_discovery_script("http://x/controlnode/discovery/report", "k1.t", MAC))
    argv = [shell, "sh", "-n", str(script)] if shell == "busybox" else [shell, "-n", str(script)]
    subprocess.run(argv, check=True, capture_output=True)


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def fake_sysfs(root: Path) -> tuple[Path, Path]:
    """A sysfs and a procfs as the kernel lays them out: the block devices' and NICs' links into
    the PCI tree the script reads transport, drivers and serials through."""
    sys, proc = root / "sys", root / "proc"
    dev = sys / "devices/pci0000:00"
    for f, v in {"sys_vendor": "Supermicro", "product_name": "SYS-120U-TNR",
                 "product_serial": "To be filled by O.E.M.", "board_serial": "OM21AS012345",
                 "product_uuid": "00000000-0000-0000-0000-3CECEF123456",
                 "bios_version": "1.4a\n"}.items():  # fmt: skip
        _write(sys / "class/dmi/id" / f, v + "\n")
    (sys / "bus/pci/drivers/nvme").mkdir(parents=True)
    (sys / "bus/pci/drivers/ice").mkdir(parents=True)
    pci = {
        "0000:00:17.0": ("0x8086", "0xa182", "0x010601", "ahci"),
        "0000:5e:00.0": ("0x144D", "0xa80a", "0x010802", "nvme"),
        "0000:98:00.0": ("0x8086", "0x159b", "0x020000", "ice"),
        "0000:98:00.1": ("0x8086", "0x159b", "0x020000", "ice"),
        "0000:02:00.0": ("0x1a03", "0x2000", "0x030000", ""),
        "0000:ff:00.0": ("garbage", "0x2000", "0x030000", ""),  # unreadable: left out
    }
    for addr, (vendor, device, cls, driver) in pci.items():
        d = dev / addr
        for f, v in (("vendor", vendor), ("device", device), ("class", cls), ("subsystem_vendor", "0x15d9"),
                     ("subsystem_device", "0x1c48")):  # fmt: skip
            _write(d / f, v + "\n")
        if driver:
            (sys / "bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
            (d / "driver").symlink_to(sys / "bus/pci/drivers" / driver)
        (sys / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
        (sys / "bus/pci/devices" / addr).symlink_to(d)
    # nvme0n1 under its controller; sda behind AHCI port ata1 (serial in VPD page 0x80); loop0.
    nvme = dev / "0000:5e:00.0/nvme/nvme0"
    _write(nvme / "model", "SAMSUNG MZQL23T8HCLS-00A07                \n")
    _write(nvme / "serial", "S64HNE0R123456      \n")
    disks = {
        "nvme0n1": (nvme / "nvme0n1", "7501476528", "0", "eui.36344830526012340025384500000001"),
        "sda": (dev / "0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda", "937703088", "1", ""),
    }
    for name, (path, size, rotational, wwid) in disks.items():
        _write(path / "size", size + "\n")
        _write(path / "queue/rotational", rotational + "\n")
        _write(path / "removable", "0\n")
        if wwid:
            _write(path / "wwid", wwid + "\n")
        (sys / "block").mkdir(parents=True, exist_ok=True)
        (sys / "block" / name).symlink_to(path)
    (nvme / "nvme0n1/device").symlink_to(nvme)
    scsi = dev / "0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0"
    (scsi / "block/sda/device").symlink_to(scsi)
    _write(scsi / "model", "ST4000NM000A-2HZ\n")
    _write(scsi / "vpd_pg80", b"\x00\x80\x00\x14" + b"        WS23ABCD")
    _write(sys / "devices/virtual/block/loop0/size", "0\n")
    (sys / "block/loop0").symlink_to(sys / "devices/virtual/block/loop0")
    # Two ports of the E810 (one with a link), lo, and a bridge (virtual: no device).
    for name, addr, mac, carrier, speed in (
        ("ens2f0", "0000:98:00.0", "40:A6:B7:11:22:30", "1", "100000"),
        ("ens2f1", "0000:98:00.1", "40:a6:b7:11:22:31", "0", "-1"),
    ):
        n = sys / "devices/pci0000:00" / addr / "net" / name
        _write(n / "address", mac + "\n")
        _write(n / "carrier", carrier + "\n")
        _write(n / "speed", speed + "\n")
        _write(n / "operstate", "up\n")
        (n / "device").symlink_to(dev / addr)
        (sys / "class/net").mkdir(parents=True, exist_ok=True)
        (sys / "class/net" / name).symlink_to(n)
    for name, mac in (("lo", "00:00:00:00:00:00"), ("br0", "02:00:00:00:00:01")):
        _write(sys / "devices/virtual/net" / name / "address", mac + "\n")
        (sys / "class/net" / name).symlink_to(sys / "devices/virtual/net" / name)
    _write(proc / "cpuinfo", "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Silver 4314 CPU @ 2.40GHz\n\n"
           "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Silver 4314 CPU @ 2.40GHz\n")  # fmt: skip
    _write(proc / "meminfo", "MemTotal:       131621248 kB\nMemFree:         1000 kB\n")
    return sys, proc


@pytest.mark.parametrize("awk", AWKS)
@pytest.mark.parametrize("shell", SHELLS)
def test_the_report_read_from_a_servers_sysfs_is_exact(tmp_path: Path, shell: str, awk: str):
    """``discovery_report`` over a sysfs tree: every disk, NIC and PCI function with the values the
    contract reads; what cannot be read (a NIC's speed without a link, a PCI id that is no id) is
    null or left out, never invalid JSON."""
    _need(shell, awk)
    sys, proc = fake_sysfs(tmp_path)
    script = render_discovery_script("http://127.0.0.1:9/controlnode/discovery/report", "k1.t", MAC)
    fns = script[
        script.index("# -- Karios discovery settings") : script.index("# -- end of discovery functions")
    ]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "awk").symlink_to(shutil.which(awk))  # type: ignore[arg-type]
    prog = fns + f'SYS="{sys}"; PROC="{proc}"; discovery_report'
    argv = [shell, "sh", "-c", prog] if shell == "busybox" else [shell, "-c", prog]
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60).stdout
    got = DiscoveryReport.model_validate_json(out)  # what the gateway does with it
    raw = json.loads(out)
    assert raw["dmi"]["product_serial"] == "To be filled by O.E.M." and raw["dmi"]["bios_version"] == "1.4a"
    assert (got.cpu_model, got.cpu_threads, got.memory_mib) == (
        "Intel(R) Xeon(R) Silver 4314 CPU @ 2.40GHz",
        2,
        128536,
    )
    assert [d.model_dump() for d in got.disks] == [
        {"name": "nvme0n1", "size_bytes": 7501476528 * 512, "model": "SAMSUNG MZQL23T8HCLS-00A07",
         "serial": "S64HNE0R123456", "wwn": "eui.36344830526012340025384500000001", "rotational": False,
         "removable": False, "transport": "nvme"},
        {"name": "sda", "size_bytes": 937703088 * 512, "model": "ST4000NM000A-2HZ", "serial": "WS23ABCD",
         "wwn": "", "rotational": True, "removable": False, "transport": "sata"},
    ]  # fmt: skip
    assert [n.model_dump() for n in got.nics] == [
        {"name": "br0", "mac": "02:00:00:00:00:01", "link": "unknown", "speed_mbps": None, "driver": "",
         "physical": False},
        {"name": "ens2f0", "mac": "40:a6:b7:11:22:30", "link": "up", "speed_mbps": 100000, "driver": "ice",
         "physical": True},
        {"name": "ens2f1", "mac": "40:a6:b7:11:22:31", "link": "down", "speed_mbps": None, "driver": "ice",
         "physical": True},
    ]  # fmt: skip
    assert [(p.address, p.vendor_id, p.device_id, p.class_code, p.driver) for p in got.pci] == [
        ("0000:00:17.0", "8086", "a182", "010601", "ahci"),
        ("0000:02:00.0", "1a03", "2000", "030000", ""),
        ("0000:5e:00.0", "144d", "a80a", "010802", "nvme"),
        ("0000:98:00.0", "8086", "159b", "020000", "ice"),
        ("0000:98:00.1", "8086", "159b", "020000", "ice"),
    ]
    assert got.pci[0].subsystem_vendor_id == "15d9" and got.boot_mac == MAC
    server = discovered_server("id", MAC, got, first_seen=AT, last_seen=AT)
    assert server.serial == "OM21AS012345"  # the board's: the system serial is a placeholder
    assert server.system.uuid == "00000000-0000-0000-0000-3cecef123456"
