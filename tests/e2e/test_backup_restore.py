"""`karios backup` of a stopped `karios up`, `karios restore` into a fresh state directory, `karios up`
on it: the token authenticates, the job is listed, the fabric config reads back, the stored secret
decrypts with the restored key ring, and the JetStream events are there. A non-empty directory is
refused. (docs/operations.md "Backup and restore".)"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.chaos import KariosUp, http_get, http_post, provision_events, state_dir
from tests.fixtures.fabric import BASE
from tests.fixtures.provision import write_inventory

BMC = "10.97.0.1"
FABRIC = {
    **BASE,  # a complete fabric configuration, with both secrets set
    "bgp_password": "bgp-s3cret-pw",
    "ospf_auth_type": "message-digest",
    "ospf_fabric_interface": "eth1",
    "ospf_auth_key": "ospfK3y",
    "ospf_auth_key_id": 7,
}


@pytest.fixture
def root() -> Iterator[Path]:
    with state_dir("karios-backup-") as path:  # not tmp_path: the embedded PG user must enter it
        yield path


def karios(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    return subprocess.run(
        [sys.executable, "-m", "karios.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
    )


def ok(status: int, body: bytes, want: int = 200) -> dict:
    assert status == want, f"{status} {body[:500]!r}"
    return json.loads(body)  # type: ignore[no-any-return]


@pytest.mark.timeout(420)
def test_backup_then_restore_into_a_fresh_state_finds_everything(root: Path):
    a, b, archive = root / "a", root / "b", root / "karios-backup.tar.gz"
    env = {"KARIOS_INVENTORY_FILE": str(write_inventory(root / "inventory.yaml", [BMC]))}
    env["KARIOS_PROVISIONER_BMC_TIMEOUT"] = "5"

    up = KariosUp(a, env=env)
    try:
        up.wait_started()
        gw, admin = up.url(), up.token
        new_token = {"name": "ops", "role": "operator"}
        token = ok(*http_post(f"{gw}/controlnode/tokens", new_token, admin)[:2], 201)["token"]
        body = {"bmc_ip": BMC, "os_ip": "10.1.97.1", "bmc_password": "bmc-s3cret-pw"}
        assert ok(*http_post(f"{gw}/controlnode/register", body, admin)[:2])["success"] is True
        job = {"bmc_IP": BMC, "vendor": "dell", "hostname": "restored-1", "os_password": "pw-restored"}
        job_id = ok(*http_post(f"{gw}/controlnode/provision", job, token, timeout=30)[:2], 202)["job_id"]
        ok(*http_post(f"{gw}/controlnode/fabric-config", FABRIC, admin, timeout=30)[:2], 201)
        fabric_before = ok(*http_get(f"{gw}/controlnode/fabric-config", admin)[:2])
        ok(*http_get(f"{gw}/controlnode/job/{job_id}", token)[:2])
        # The backup is offline: refused while `karios up` runs on the state directory.
        busy = karios("backup", "--state-dir", str(a), "--out", str(archive))
        assert busy.returncode == 1 and "stop `karios up`" in busy.stderr, busy.stderr
        assert not archive.exists()
    finally:
        assert up.stop() == 0, up.text()

    t0 = time.monotonic()
    done = karios("backup", "--state-dir", str(a), "--out", str(archive))
    assert done.returncode == 0, done.stdout + done.stderr
    took = time.monotonic() - t0
    assert "WARNING" in done.stderr and "key ring" in done.stderr
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert "keyring.json" in names and "postgres/karios.dump" in names
    assert any(n.startswith("nats/jetstream/") for n in names)
    # Not the embedded NATS's login (issue 24 S5): the restored directory gets its own.
    assert not [n for n in names if n.endswith(".conf") or "nats-credentials" in n], names
    assert set(manifest["alembic"]["karios"]) == {"gateway", "provision", "inventory", "fabric"}
    assert manifest["postgres_version"] and manifest["nats_server"].startswith("nats-server")

    # Into a directory that holds data: refused, nothing touched.
    refused = karios("restore", "--state-dir", str(a), str(archive))
    assert refused.returncode == 1 and "not empty" in refused.stderr, refused.stderr
    assert "--force" in refused.stderr

    # An archive from a newer schema than this code knows: refused, with the reason.
    newer = root / "newer.tar.gz"
    with tarfile.open(archive) as src, tarfile.open(newer, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()  # type: ignore[union-attr]
            if m.name == "manifest.json":
                doc = json.loads(data)
                doc["alembic"]["karios"]["gateway"] = "0999_from_the_future"
                data = json.dumps(doc).encode()
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    too_new = karios("restore", "--state-dir", str(root / "c"), str(newer))
    assert too_new.returncode == 1 and "newer" in too_new.stderr and "0999_from_the_future" in too_new.stderr
    assert not (root / "c").exists()

    done = karios("restore", "--state-dir", str(b), str(archive))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (b / "secret.key").read_text() == (a / "secret.key").read_text()
    assert stat.S_IMODE((b / "secret.key").stat().st_mode) == 0o600

    up = KariosUp(b, env=env)
    try:
        up.wait_started()
        gw = up.url()
        assert up.token == admin
        who = ok(*http_get(f"{gw}/controlnode/tokens/self", token)[:2])
        assert who["name"] == "ops", who
        listed = ok(*http_get(f"{gw}/controlnode/jobs?id_prefix={job_id}", token)[:2])
        assert [j["id"] for j in listed["items"]] == [job_id], listed
        fabric_after = ok(*http_get(f"{gw}/controlnode/fabric-config", admin)[:2])
        assert fabric_after == fabric_before
        assert fabric_after["bgp_password_is_set"] and fabric_after["ospf_auth_key_is_set"]
        # A write decrypts the stored OSPF key (its length is a rule): with a lost or wrong key
        # ring this answers 500 SECRET_DECRYPT_FAILED.
        change = {"vxlan_mtu": 9100, "skip_switch_ack": True}
        changed = ok(*http_post(f"{gw}/controlnode/fabric-config", change, admin, timeout=30)[:2])
        assert changed["vxlan_mtu"] == 9100
        # JetStream came back: the event stream from its start has the registration of state A.
        seen = provision_events(up, BMC.encode())
        assert b"node_registered" in seen and BMC.encode() in seen and b"bmc-s3cret-pw" not in seen
        restored_login = b / "nats-credentials.json"
        assert stat.S_IMODE(restored_login.stat().st_mode) == 0o600
        assert restored_login.read_text() != (a / "nats-credentials.json").read_text()
        print(f"backup of a stopped karios up in {took:.1f}s ({archive.stat().st_size // 1024} KiB)")
    finally:
        assert up.stop() == 0, up.text()
