"""Node adoption (issue 13 item 3) through the gateway: real NATS + PostgreSQL, the real
inventory, fabric-worker and gateway, the fabric lab's namespace nodes with real sshd + FRR.

node1 is adopted by SSH private key (the lab's sshd, port 22); node2 by password through a second
sshd in node2's namespaces (port 2222, password login, a private /etc/shadow bind-mounted in its
own mount namespace so the host's accounts are untouched). Host keys are pinned on first contact
and answered as fingerprints; the fabric's preflight and apply reach the adopted nodes with their
own credentials; a changed host key is refused by adoption and by the fabric; an unreachable
address is a 502 naming it, nothing stored; removal is refused while the node holds fabric state.

Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.auth import Role, create_token
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import VIEWER, VIEWER_TOKEN, finished, forget_every_node, forget_jobs, sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
PASSWORD = "adopt-Secret-7q"
PW_PORT = 2222
CONFIG = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_name": "rr",
    "fabric_switch_nos": "other",
    "fabric_switch_peering_ip": fabric_lab.FABRIC_IP,
    "fabric_switch_role": "spine",
    "management_cidr": "198.18.0.0/24",
    "router_id_cidr": "198.19.1.1/24",
    "vxlan_mtu": 1500,
    "ospf_enabled": False,
    "expected_nodes": 3,
}
NODE_IPS = [fabric_lab.underlay_ip(i) for i in (1, 2, 3)]


class PasswordSshd:
    """A second sshd in a lab node's namespaces (its /etc/frr, hostname, network) that accepts
    root by password: /etc/shadow is replaced by a bind mount in a mount namespace of its own."""

    def __init__(self, lab: fabric_lab.FabricLab, node: int, port: int) -> None:
        self.lab, self.node, self.port = lab, lab.node(node), port
        self.dir = Path(lab.workdir) / f"pwsshd-{node}"
        self.proc: subprocess.Popen | None = None

    def start(self, *, new_host_key: bool = False) -> str:
        """Start (again); returns the host key's fingerprint (``SHA256:…``)."""
        self.dir.mkdir(exist_ok=True)
        key = self.dir / "host_key"
        if new_host_key or not key.exists():
            key.unlink(missing_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        pw_hash = subprocess.run(
            ["openssl", "passwd", "-6", PASSWORD], capture_output=True, text=True, check=True
        ).stdout.strip()
        lines = [ln for ln in Path("/etc/shadow").read_text().splitlines() if not ln.startswith("root:")]
        (self.dir / "shadow").write_text(f"root:{pw_hash}:19000:0:99999:7:::\n" + "\n".join(lines) + "\n")
        (self.dir / "shadow").chmod(0o640)
        (self.dir / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress {self.node.underlay_ip}\nHostKey {key}\n"
            f"PidFile {self.dir}/sshd.pid\nUsePAM no\nStrictModes no\nPermitRootLogin yes\n"
            "PasswordAuthentication yes\nPubkeyAuthentication no\nKbdInteractiveAuthentication no\n"
            "UseDNS no\nPrintMotd no\nLogLevel INFO\n"
        )
        script = 'mount --bind "$1" /etc/shadow && exec /usr/sbin/sshd -D -e -f "$2"'
        log = open(self.dir / "sshd.log", "ab")  # noqa: SIM115 (kept by the process)
        self.proc = subprocess.Popen(
            ["nsenter", "-t", str(self.node.sshd_pid), "-m", "-n", "-u", "--", "unshare", "-m",
             "--propagation", "private", "--", "sh", "-c", script, "sh",
             str(self.dir / "shadow"), str(self.dir / "sshd_config")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        wait_until_listening(self.node.underlay_ip, self.port)
        out = subprocess.run(["ssh-keygen", "-lf", f"{key}.pub"], capture_output=True, text=True, check=True)
        return out.stdout.split()[1]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def wait_until_listening(ip: str, port: int) -> None:
    deadline = time.monotonic() + 15
    while True:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((ip, port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd on {ip}:{port} did not start")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def lab():
    fabric_lab.require_lab()
    with fabric_lab.FabricLab(n_nodes=3, prefix="kn") as lab:
        yield lab


async def _forget_lab_nodes(settings) -> None:  # type: ignore[no-untyped-def]
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=NODE_IPS)
    await sql(settings, "DELETE FROM inventory.compute_nodes WHERE node_ip = ANY(:n)", n=NODE_IPS)
    await sql(settings, "DELETE FROM inventory.bmc_infos WHERE os_ip = ANY(:n)", n=NODE_IPS)


@pytest.fixture
async def api(settings, serve, lab):
    await serve(inventory_app(settings))
    # The worker's own key is NOT the lab's: adopted nodes must be reached with their credentials.
    rollout = FabricWorkerSettings(
        _env_file=None, ssh_key=None, connect_timeout=5, verify_timeout=30, preflight_timeout=15
    )
    await serve(worker_app(settings, rollout_settings=rollout))
    await forget_jobs(settings)
    await forget_every_node(settings)  # the listing and the apply must see only this lab's nodes
    gw = await serve(gateway_app(settings))
    await create_token(gw.app.state.runtime.db, "viewer-vic", Role.viewer, VIEWER_TOKEN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=120, headers=ADMIN) as c:
        yield c
        await c.delete("/controlnode/fabric-config")
    await _forget_lab_nodes(settings)


@pytest.fixture
def pw_sshd(lab):
    started: list[PasswordSshd] = []

    def make(node: int) -> PasswordSshd:
        started.append(PasswordSshd(lab, node, PW_PORT))
        return started[-1]

    yield make
    for s in started:
        s.stop()


def _no_secret(*texts: str, key: str) -> None:
    body_of_key = "".join(key.strip().splitlines()[1:-1])[:40]
    for t in texts:
        assert PASSWORD not in t and body_of_key not in t.replace("\n", "").replace("\\n", "")


async def test_adopt_by_key_and_password_pins_host_keys_and_the_fabric_uses_them(api, lab, settings, pw_sshd):
    c = api
    key = Path(lab.client_key_path).read_text()
    n1, n2, _n3 = lab.nodes
    sshd2 = pw_sshd(2)
    fp2 = sshd2.start()

    t0 = time.perf_counter()
    r1 = await c.post(
        "/controlnode/nodes", json={"node_ip": n1.underlay_ip, "ssh_private_key": key, "hostname": "node1"}
    )
    assert r1.status_code == 201, r1.text
    assert r1.json()["host_key_fingerprint"] == n1.host_key_fingerprint
    assert (r1.json()["auth"], r1.json()["source"], r1.json()["ssh_port"]) == ("ssh_key", "adopted", 22)
    r2 = await c.post(
        "/controlnode/nodes",
        json={"node_ip": n2.underlay_ip, "ssh_password": PASSWORD, "ssh_port": PW_PORT, "hostname": "node2"},
    )
    assert r2.status_code == 201, r2.text
    assert (r2.json()["host_key_fingerprint"], r2.json()["auth"]) == (fp2, "password")
    print(f"adoption by key + by password: {time.perf_counter() - t0:.2f} s")  # docs/inventory.md

    # Pinned in the fabric's pin store; the secrets are stored only as ciphertext.
    pins = await sql(
        settings, "SELECT node_ip, host_key FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=NODE_IPS
    )
    assert {p["node_ip"] for p in pins} == {n1.underlay_ip, n2.underlay_ip}
    assert next(p["host_key"] for p in pins if p["node_ip"] == n1.underlay_ip) == n1.host_public_key
    rows = await sql(settings, "SELECT * FROM inventory.compute_nodes WHERE node_ip = ANY(:n)", n=NODE_IPS)
    assert len(rows) == 2
    _no_secret(*(str(dict(r)) for r in rows), key=key)

    # Listing (viewer, paginated) and one node.
    r = await c.get("/controlnode/nodes", headers=VIEWER)
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["total"] == 2 and [n["node_ip"] for n in page["items"]] == [n1.underlay_ip, n2.underlay_ip]
    r = await c.get("/controlnode/nodes?offset=1&limit=1", headers=VIEWER)
    assert [n["node_ip"] for n in r.json()["items"]] == [n2.underlay_ip] and r.json()["total"] == 2
    one = await c.get(f"/controlnode/nodes/{n2.underlay_ip}", headers=VIEWER)
    assert one.status_code == 200 and one.json()["hostname"] == "node2"
    _no_secret(r1.text, r2.text, page.__repr__(), one.text, key=key)

    # The fabric's node set: preflight reaches both with their own credentials (node3 is not in it).
    assert (await c.post("/controlnode/fabric-config", json=CONFIG)).status_code == 201
    r = await c.post("/controlnode/fabric-config/preflight", json={"underlay_cidr": "198.18.0.0/24"})
    assert r.status_code == 200, r.text
    modes = {n["node_ip"]: n["mode"] for n in r.json()["nodes"]}
    assert modes == {n1.underlay_ip: "reuse", n2.underlay_ip: "reuse"}, r.json()["nodes"]

    # An apply reaches both (node2 through its password sshd on port 2222) and verifies them.
    r = await c.post("/controlnode/fabric-config/apply")
    assert r.status_code == 202, r.text
    job = await finished(c, r.json()["apply_job_id"])
    assert (job["job_status"], job["completed_nodes"]) == ("completed", 2), job
    states = lab.rr_evpn_peer_states()
    assert states.get(n1.underlay_ip) == "Established" and states.get(n2.underlay_ip) == "Established", states

    # Removal is refused while the node holds fabric state (its VTEP), naming node and VTEP.
    r = await c.delete(f"/controlnode/nodes/{n1.underlay_ip}")
    assert r.status_code == 409, r.text
    assert n1.underlay_ip in r.json()["message"] and "VTEP 198.19.1." in r.json()["message"]
    assert (await c.get(f"/controlnode/nodes/{n1.underlay_ip}")).status_code == 200

    # Node2's host key changes: adoption again is refused, and so is the fabric (preflight says why).
    sshd2.stop()
    fp_new = sshd2.start(new_host_key=True)
    assert fp_new != fp2
    r = await c.post(
        "/controlnode/nodes", json={"node_ip": n2.underlay_ip, "ssh_password": PASSWORD, "ssh_port": PW_PORT}
    )
    assert r.status_code == 409 and r.json()["code"] == "HOST_KEY_CHANGED", r.text
    assert (await c.get(f"/controlnode/nodes/{n2.underlay_ip}")).json()["host_key_fingerprint"] == fp2
    # Even with the fabric's pin store lost, the key the inventory holds is checked.
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = :n", n=n2.underlay_ip)
    r = await c.post(
        "/controlnode/nodes", json={"node_ip": n2.underlay_ip, "ssh_password": PASSWORD, "ssh_port": PW_PORT}
    )
    assert r.status_code == 409 and r.json()["code"] == "HOST_KEY_CHANGED", r.text
    r = await c.post("/controlnode/fabric-config/preflight", json={"underlay_cidr": "198.18.0.0/24"})
    bad = next(n for n in r.json()["nodes"] if n["node_ip"] == n2.underlay_ip)
    assert bad["mode"] == "unreachable" and "host key changed" in bad["reason"], bad

    # Tear the fabric down from node1, then it can be removed; the pin goes with it.
    r = await c.delete(f"/controlnode/fabric-config/node/{n1.underlay_ip}")
    assert r.status_code == 200, r.text
    r = await c.delete(f"/controlnode/nodes/{n1.underlay_ip}")
    assert r.status_code == 200 and r.json()["node_ip"] == n1.underlay_ip, r.text
    assert (await c.get(f"/controlnode/nodes/{n1.underlay_ip}")).status_code == 404
    pins = await sql(
        settings, "SELECT node_ip FROM fabric.node_host_keys WHERE node_ip = :n", n=n1.underlay_ip
    )
    assert pins == []
    assert (await c.get("/controlnode/nodes")).json()["total"] == 1


async def test_unreachable_wrong_password_and_bad_input_store_nothing(api, lab, settings, pw_sshd):
    c = api
    n3 = lab.nodes[2]
    # Nothing listens on that port: 502 naming the address, port and cause.
    r = await c.post(
        "/controlnode/nodes", json={"node_ip": n3.underlay_ip, "ssh_password": PASSWORD, "ssh_port": 2999}
    )
    assert r.status_code == 502, r.text
    err = r.json()
    assert err["code"] == "NODE_UNREACHABLE" and f"{n3.underlay_ip} port 2999" in err["message"], err
    assert "refused" in err["message"].lower() or "connect" in err["message"].lower()
    # A wrong password on a real sshd: 502 naming the address and "authentication failed".
    pw_sshd(3).start()
    r = await c.post(
        "/controlnode/nodes",
        json={"node_ip": n3.underlay_ip, "ssh_password": "wrong-pw", "ssh_port": PW_PORT},
    )
    assert r.status_code == 502 and "authentication failed" in r.json()["message"], r.text
    assert "wrong-pw" not in r.text
    assert (await c.get(f"/controlnode/nodes/{n3.underlay_ip}")).status_code == 404
    assert (
        await sql(settings, "SELECT 1 FROM inventory.compute_nodes WHERE node_ip = :n", n=n3.underlay_ip)
        == []
    )
    # A host key is pinned only by a successful login.
    assert (
        await sql(settings, "SELECT 1 FROM fabric.node_host_keys WHERE node_ip = :n", n=n3.underlay_ip) == []
    )

    # Bad input: 422 naming the field.
    cases = [
        ({"node_ip": n3.underlay_ip}, "ssh_password"),
        ({"node_ip": "not-an-ip", "ssh_password": "x"}, "node_ip"),
        ({"node_ip": n3.underlay_ip, "ssh_password": "x", "ssh_port": 70000}, "ssh_port"),
        ({"node_ip": n3.underlay_ip, "ssh_password": "x\x00y"}, "ssh_password"),
        ({"node_ip": n3.underlay_ip, "ssh_private_key": "not a key"}, "ssh_private_key"),
        ({"node_ip": n3.underlay_ip, "ssh_password": "x", "surprise": 1}, "surprise"),
    ]
    for body, field in cases:
        r = await c.post("/controlnode/nodes", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["field"] == field or field in {e["field"] for e in r.json().get("errors") or []}, (
            r.text
        )
    assert (await c.get("/controlnode/nodes/abc")).status_code == 422
    assert (await c.get("/controlnode/nodes?limit=0")).status_code == 422
    # Roles: a viewer may list, not adopt nor remove.
    r = await c.post(
        "/controlnode/nodes", json={"node_ip": n3.underlay_ip, "ssh_password": "x"}, headers=VIEWER
    )
    assert r.status_code == 403
    assert (await c.delete(f"/controlnode/nodes/{n3.underlay_ip}", headers=VIEWER)).status_code == 403
    assert (await c.delete(f"/controlnode/nodes/{n3.underlay_ip}")).status_code == 404
