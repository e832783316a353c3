"""Self-test of the Redfish lab: `python3 tests/lab/selftest_redfish_lab.py`.

Starts a sushy-emulator with two fake systems and basic auth, walks the Redfish tree by
following links (service root -> Systems -> system -> Manager / VirtualMedia -> Cd),
powers a system on (instant with the zero-delay launcher), then stops it.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import redfish_lab


def step(label: str, t0: float) -> float:
    now = time.monotonic()
    print(f"  {label:<48} {now - t0:7.3f} s", flush=True)
    return now


def main() -> int:
    print("redfish lab self-test")
    t = t_all = time.monotonic()
    exe = redfish_lab.find_sushy_emulator()
    t = step("find/install sushy-emulator", t)
    print(f"    {exe}")

    systems = [
        redfish_lab.fake_system("node1", macs=["52:54:00:00:00:11"]),
        redfish_lab.fake_system("node2", macs=["52:54:00:00:00:12", "52:54:00:00:01:12"]),
    ]
    emu = redfish_lab.RedfishEmulator(systems)
    with emu:
        t = step("emulator up (auth, 2 systems)", t)
        print("    timings:", {k: round(v, 3) for k, v in emu.timings.items()})
        assert emu.url.startswith("http://127.0.0.1:")

        root = emu.get("/redfish/v1/", auth=False)  # service root stays open
        systems_path = root["Systems"]["@odata.id"]
        status, _ = emu.request("GET", systems_path, auth=False)
        assert status == 401, f"without credentials: {status}"
        status, _ = emu.request("GET", systems_path, auth=(emu.username, "wrong"))
        assert status == 401, f"wrong password: {status}"

        collection = emu.get(systems_path)
        members = [m["@odata.id"] for m in collection["Members"]]
        assert sorted(p.rsplit("/", 1)[1] for p in members) == sorted(emu.system_ids), members
        t = step("GET Systems with auth (401 without)", t)

        by_id = {}
        for path in members:
            system = emu.get(path)
            by_id[system["Id"]] = system
        node2 = next(s for s in by_id.values() if s["Name"] == "node2")
        assert node2["PowerState"] == "Off"
        nics = emu.get(emu.get(node2["EthernetInterfaces"]["@odata.id"])["Members"][0]["@odata.id"])
        assert nics["MACAddress"].lower().startswith("52:54:00"), nics

        manager = emu.get(node2["Links"]["ManagedBy"][0]["@odata.id"])
        vmedia_path = (node2.get("VirtualMedia") or manager.get("VirtualMedia"))["@odata.id"]
        vmedia = emu.get(vmedia_path)
        slots = {m["@odata.id"].rsplit("/", 1)[1]: m["@odata.id"] for m in vmedia["Members"]}
        assert "Cd" in slots, slots
        cd = emu.get(slots["Cd"])
        assert "CD" in cd["MediaTypes"] or "DVD" in cd["MediaTypes"], cd
        assert cd["Actions"]["#VirtualMedia.InsertMedia"]["target"]
        t = step("followed links to System/VirtualMedia/Cd", t)
        print(f"    {vmedia_path}/Cd")

        status, _ = emu.request("GET", f"/redfish/v1/Systems/{node2['Name']}")
        assert status in (301, 302, 307, 308), f"GET by name: {status}"

        reset = node2["Actions"]["#ComputerSystem.Reset"]["target"]
        status, body = emu.request("POST", reset, {"ResetType": "On"})
        assert status in (200, 202, 204), (status, body)
        state = emu.get(node2["@odata.id"])["PowerState"]
        assert state == "On", f"power not instant: {state}"
        t = step("power On applied at the next GET", t)
        proc, workdir = emu._proc, emu.workdir

    t = step("stop", t)
    assert proc.poll() is not None, "emulator still running"
    assert not os.path.exists(workdir), workdir
    print(f"  {'total':<48} {time.monotonic() - t_all:7.3f} s")
    print("redfish lab self-test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
