"""Discovery of unknown servers (issue 27 item 3) end to end on the real NATS and PostgreSQL, with
the discovery script run for real inside the built live environment (its own sh, mawk, curl,
coreutils; ``chroot`` in a mount namespace with this machine's /dev, /proc and /sys bound in, as
/init mounts them): this machine is the "unknown server".

bootapi (discovery on, no host in its inventory) answers this machine's MAC with the discovery iPXE
script; the overlay that script names is fetched from the running provisioner; its ``run.sh`` —
with the gateway's URL and the token bootapi issued — reads the hardware and posts it to the running
gateway. The discovered server then has this machine's disks (``/sys/block``) and physical NICs
(``/sys/class/net``), an SSE ``server_discovered`` event went out, a second report of the same
machine is the same record, and adoption marks it adopted with the NetBox device to create. Not
run here: the script's ``wake_links`` (it would bring this machine's NICs up) and the power-off
(``/init``'s, after run.sh).
"""

from __future__ import annotations

import asyncio
import gzip
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.bootapi.app import create_app as bootapi_app
from karios.common.discovery_token import DiscoveryTokens
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.media.cpio import read_newc
from tests.fixtures.apps import ADMIN
from tests.fixtures.bootapi import boot_settings
from tests.fixtures.bootapi_hosts import EmptyHosts
from tests.fixtures.installs import LIVE_PATH, in_live
from tests.fixtures.sse import open_sse

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]
SKIPPED_DISKS = ("loop", "ram", "zram", "md", "dm-", "sr", "nbd", "fd", "mtdblock")


def this_machines_disks() -> dict[str, int]:
    """What the script must report: every block device but virtual ones, with its size in bytes."""
    disks = {}
    for d in sorted(Path("/sys/block").iterdir()):
        size = int((d / "size").read_text())
        if not d.name.startswith(SKIPPED_DISKS) and size > 0:
            disks[d.name] = size * 512
    return disks


def this_machines_nics() -> dict[str, str]:
    """Physical NICs (a device behind them) with an Ethernet MAC: name → MAC."""
    nics = {}
    for n in sorted(Path("/sys/class/net").iterdir()):
        mac = (n / "address").read_text().strip().lower()
        if (n / "device").exists() and re.fullmatch(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", mac) and mac.strip("0:"):
            nics[n.name] = mac
    return nics


@pytest.fixture
async def stack(settings, serve, tmp_path):  # type: ignore[no-untyped-def]
    gw = await serve(gateway_app(settings))
    cfg = ProvisionerConfig(cache_dir=tmp_path / "cache", media_dir=tmp_path / "media", callback_url=gw.url)
    prov = await serve(provisioner_app(settings, cfg))
    boot = await serve(
        bootapi_app(
            settings,
            boot_settings(discovery_enabled=True, discovery_images_url=prov.url),
            host_source=EmptyHosts(),  # every MAC is unknown
        )
    )
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=60) as client:
        client.gw_url, client.prov_url, client.boot_url = gw.url, prov.url, boot.url  # type: ignore[attr-defined]
        yield client


def _token(tokens: DiscoveryTokens, mac: str) -> dict[str, str]:
    return {"X-Karios-Discovery-Token": tokens.issue(mac, now=time.time())}


def run_in_live(root: Path, run_sh: str) -> subprocess.CompletedProcess[str]:
    """The served run.sh's settings and functions, then its report and delivery (its main part
    without wake_links and without the power-off that /init does after it)."""
    fns = run_sh[
        run_sh.index("# -- Karios discovery settings") : run_sh.index("# -- end of discovery functions")
    ]
    prog = fns + 'discovery_report > "$REPORT" && send_report "$REPORT"'
    return subprocess.run(
        in_live(root, prog, mounts=("dev", "proc", "sys")),
        env={"PATH": LIVE_PATH},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_an_unknown_machine_reports_its_hardware_from_the_live_environment(
    stack, settings, live_root: Path
) -> None:
    nics = this_machines_nics()
    if not nics:
        pytest.skip("this machine has no physical NIC to boot from")
    boot_mac = next(iter(nics.values()))
    t0 = time.monotonic()

    # 1. bootapi: the unknown MAC gets the live environment in discovery mode, with a token.
    async with httpx.AsyncClient(timeout=30) as plain:
        ipxe = (await plain.get(f"{stack.boot_url}/ipxe/{boot_mac.replace(':', '-')}")).text
        (token,) = re.findall(r"karios\.discovery=(\S+)", ipxe)
        assert f"initrd {stack.prov_url}/images/bookworm/live.img" in ipxe
        (overlay_url,) = re.findall(r"^initrd (\S+/discovery/\S+/overlay\.img)$", ipxe, re.M)
        # 2. The provisioner serves that boot's overlay; a forged token gets none.
        overlay = await plain.get(overlay_url)
        assert overlay.status_code == 200, overlay.text
        forged = await plain.get(
            overlay_url.replace(token, token[:-2] + ("AA" if token[-2:] != "AA" else "BB"))
        )
        assert forged.status_code == 401 and forged.json()["code"] == "DISCOVERY_TOKEN_INVALID"
    files = read_newc(gzip.decompress(overlay.content))
    run_sh = files["karios/run.sh"].decode()
    assert f"URL={stack.gw_url}/controlnode/discovery/report\n" in run_sh and f"TOKEN={token}\n" in run_sh
    assert f"NET_MAC={boot_mac}" in files["karios/net.env"].decode()

    # 3. The script, in the live environment, reports this machine to the gateway.
    async with open_sse(stack, "/controlnode/events?channel=provision") as sse:
        res = await asyncio.to_thread(run_in_live, live_root, run_sh)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "karios: hardware reported: " in res.stdout, res.stdout
        events = await sse.collect(until=lambda evs: any(e.event == "server_discovered" for e in evs))
    event = next(e for e in events if e.event == "server_discovered").json()
    first_report = time.monotonic() - t0

    listed = await stack.get("/controlnode/discovered")
    assert listed.status_code == 200, listed.text
    (server,) = [s for s in listed.json() if s["boot_mac"] == boot_mac]  # the module shares a database
    assert event["data"]["id"] == server["id"] and event["data"]["created"] is True
    assert server["status"] == "discovered" and server["boot_mac"] == boot_mac
    assert {d["name"]: d["size_bytes"] for d in server["drives"]} == this_machines_disks()
    assert {n["name"]: n["mac"] for n in server["nics"]} == nics
    assert server["memory_mib"] and server["processor_threads"]
    assert len(server["pcie_devices"]) == len(list(Path("/sys/bus/pci/devices").iterdir()))

    # 4. The same machine again: the same record, counted.
    res = await asyncio.to_thread(run_in_live, live_root, run_sh)
    assert res.returncode == 0 and '"created":false' in res.stdout.replace(" ", ""), res.stdout
    (again,) = [s for s in (await stack.get("/controlnode/discovered")).json() if s["boot_mac"] == boot_mac]
    assert again["id"] == server["id"] and again["report_count"] == 2

    # 5. Adoption: marked adopted, the NetBox device (planned) with this machine's NICs.
    adopted = await stack.post(f"/controlnode/discovered/{server['id']}/adopt", json={"hostname": "disc-01"})
    assert adopted.status_code == 200, adopted.text
    body = adopted.json()
    assert body["server"]["status"] == "adopted" and body["server"]["hostname"] == "disc-01"
    assert body["netbox_device"]["status"] == "planned" and body["netbox_written"] is False
    assert {i["mac_address"] for i in body["netbox_device"]["interfaces"]} == set(nics.values())
    still = await stack.get("/controlnode/discovered?status=discovered")
    assert server["id"] not in [s["id"] for s in still.json()]
    assert server["id"] in [
        s["id"] for s in (await stack.get("/controlnode/discovered?status=adopted")).json()
    ]
    print(f"\ndiscovery: first report recorded {first_report:.1f} s after the iPXE request")


async def test_the_report_endpoint_checks_the_token_then_the_report(stack, settings) -> None:
    tokens = DiscoveryTokens.from_settings(settings)
    mac = "52:54:00:de:00:01"
    good = {"nics": [{"name": "eth0", "mac": mac}], "disks": [{"name": "vda", "size_bytes": 10**9}]}
    url = "/controlnode/discovery/report"
    async with httpx.AsyncClient(base_url=stack.gw_url, timeout=30) as anyone:  # no operator token
        none = await anyone.post(url, json=good)
        assert none.status_code == 401 and none.json()["code"] == "DISCOVERY_TOKEN_INVALID"
        expired = tokens.issue(mac, now=time.time() - 100, ttl=10)
        old = await anyone.post(
            url, json={"disks": "not even a list"}, headers={"X-Karios-Discovery-Token": expired}
        )
        assert old.status_code == 401 and old.json()["code"] == "DISCOVERY_TOKEN_EXPIRED"  # before the body
        h = {"X-Karios-Discovery-Token": tokens.issue(mac, now=time.time())}
        bad = await anyone.post(url, json={**good, "disks": [{"name": "vda", "size_bytes": -5}]}, headers=h)
        assert bad.status_code == 422 and bad.json()["field"] == "disks.0.size_bytes", bad.text
        other = await anyone.post(
            url, json={**good, "nics": [{"name": "eth0", "mac": "52:54:00:de:00:02"}]}, headers=h
        )
        assert other.status_code == 422 and other.json()["field"] == "nics", other.text
        ok = await anyone.post(url, json=good, headers=h)
        assert ok.status_code == 200 and ok.json()["created"] is True, ok.text
        same = await anyone.post(url, json=good, headers=h)
        assert same.json() == {**ok.json(), "created": False, "changed": False}
        # One machine booting from its second NIC is the same machine: found by its serial.
        nics = [{"name": "eno1", "mac": "52:54:00:de:00:0a"}, {"name": "eno2", "mac": "52:54:00:de:00:0b"}]
        two = {"dmi": {"product_serial": "SER-1"}, "nics": nics}
        first = await anyone.post(url, json=two, headers=_token(tokens, "52:54:00:de:00:0a"))
        second = await anyone.post(url, json=two, headers=_token(tokens, "52:54:00:de:00:0b"))
        assert first.json()["created"] is True, first.text
        assert second.json() == {**first.json(), "created": False, "changed": True}
        listed = await anyone.get("/controlnode/discovered")
        assert listed.status_code == 401  # the list is the operators'
    missing = await stack.post("/controlnode/discovered/no-such-id/adopt", json={})
    assert missing.status_code == 404 and missing.json()["code"] == "DISCOVERED_SERVER_NOT_FOUND"
    machine = (await stack.get(f"/controlnode/discovered/{first.json()['id']}")).json()
    assert machine["boot_mac"] == "52:54:00:de:00:0b" and machine["serial"] == "SER-1"
    macs = [m["boot_mac"] for m in (await stack.get("/controlnode/discovered")).json()]
    assert machine["report_count"] == 2 and "52:54:00:de:00:0a" not in macs  # one record, not two
    assert macs.count("52:54:00:de:00:0b") == 1 and macs.count(mac) == 1
    bad_name = await stack.post(f"/controlnode/discovered/{ok.json()['id']}/adopt", json={"hostname": "-x"})
    assert bad_name.status_code == 422 and bad_name.json()["field"] == "hostname"


async def test_the_discovered_list_is_paged_newest_first(stack, settings) -> None:
    # Issue 28: the list was every record (~2 KB each, 389 KB for 200). Now one page: `limit`
    # (100 unless given, at most 1,000) after `offset`; the pages do not overlap.
    tokens = DiscoveryTokens.from_settings(settings)
    macs = [f"52:54:00:dd:00:{i:02x}" for i in range(5)]
    async with httpx.AsyncClient(base_url=stack.gw_url, timeout=30) as anyone:
        for mac in macs:  # oldest first
            body = {"nics": [{"name": "eth0", "mac": mac}], "disks": [{"name": "vda", "size_bytes": 10**9}]}
            r = await anyone.post("/controlnode/discovery/report", json=body, headers=_token(tokens, mac))
            assert r.status_code == 200, r.text
    everything = [s["boot_mac"] for s in (await stack.get("/controlnode/discovered")).json()]
    assert everything[:5] == macs[::-1]  # newest report first
    pages = []
    for offset in (0, 2, 4):
        r = await stack.get("/controlnode/discovered", params={"limit": 2, "offset": offset})
        assert r.status_code == 200, r.text
        pages.append([s["boot_mac"] for s in r.json()])
    assert [len(p) for p in pages] == [2, 2, min(2, len(everything) - 4)]
    paged = [mac for page in pages for mac in page]
    assert paged == everything[: len(paged)]
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}):
        r = await stack.get("/controlnode/discovered", params=bad)
        assert r.status_code == 422 and r.json()["field"] == next(iter(bad)), r.text
