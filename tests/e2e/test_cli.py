"""The `karios` CLI against `karios up` with emulated BMCs: every verb, `--watch` to the end, exit
codes a script can rely on, errors a person can read, and tokens through the gateway."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.fixtures.chaos import KariosUp, state_dir
from tests.fixtures.cli import readme_client_examples
from tests.fixtures.provision import bmc_medium_url, inserts_seen, medium_token, write_inventory
from tests.fixtures.wait import wait_until_sync
from tests.lab.redfish_lab import RedfishEmulator, fake_system

BMCS = ["10.96.0.1", "10.96.0.2", "10.96.0.3"]
DEAD_BMC = "10.96.0.9"  # in the inventory, its BMC endpoint refuses connections
INVENTORY_BMC = "127.0.0.1"  # the emulator itself, found from the inventory record alone


class System:
    def __init__(self, up: KariosUp, emu: RedfishEmulator, root: Path) -> None:
        self.up, self.emu, self.root = up, emu, root
        self.config = up.state / "client.json"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
        env["KARIOS_CONFIG"] = str(self.config)
        env["COLUMNS"] = "160"
        env.update(extra)
        return env

    def karios(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "karios.cli", *args],
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """The CLI as a terminal runs it: SIGINT at its default, whatever this process inherited (a
        test run started with `&` from a script has SIGINT ignored, and Python then installs no
        KeyboardInterrupt handler: Ctrl-C would not reach the CLI)."""
        return subprocess.Popen(
            [sys.executable, "-m", "karios.cli", *args],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def medium_url(self, job_id: str) -> str:
        """The job's boot medium as the BMC downloads it from the provisioner."""
        return bmc_medium_url(self.emu, job_id)  # signed: the URL InsertMedia was given


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    emu = RedfishEmulator([fake_system(f"cli{i}") for i in range(len(BMCS) + 1)]).start()
    try:
        with state_dir("karios-cli-") as root:
            inv = write_inventory(root / "inventory.yaml", [*BMCS, DEAD_BMC, INVENTORY_BMC])
            # This one is reached only through its inventory record (no side table): scheme, port
            # and Redfish system from the device's custom fields.
            data = yaml.safe_load(inv.read_text())
            data["devices"][-1]["custom_fields"] = {
                "bmc_scheme": "http",
                "bmc_port": emu.port,
                "redfish_system_id": emu.system_ids[-1],
            }
            inv.write_text(yaml.safe_dump(data))
            endpoints = {
                ip: {"url": emu.url, "system_id": sid, "username": emu.username, "password": emu.password}
                for ip, sid in zip(BMCS, emu.system_ids[: len(BMCS)], strict=True)
            }
            endpoints[DEAD_BMC] = {"url": "http://127.0.0.1:9", "username": "a", "password": "b"}
            up = KariosUp(
                root / "state",
                env={
                    "KARIOS_INVENTORY_FILE": str(inv),
                    "KARIOS_PROVISIONER_BMC_ENDPOINTS": json.dumps(endpoints),
                    "KARIOS_PROVISIONER_INSTALL_METHOD": "preseed",
                    "KARIOS_PROVISIONER_BMC_RETRIES": "1",
                    "KARIOS_PROVISIONER_BMC_BACKOFF": "0.1",
                },
            )
            try:
                up.wait_started()
                yield System(up, emu, root)
            finally:
                up.stop()
    finally:
        emu.stop()


def test_karios_up_writes_a_private_client_context_and_login_checks_it(system: System):
    ctx = json.loads(system.config.read_text())
    assert ctx["url"] == system.up.url() and ctx["token"] == system.up.token
    assert stat.S_IMODE(system.config.stat().st_mode) == 0o600
    assert f"context in {system.config}" in system.up.text()
    # ... and under its state directory's name, so another system on this machine keeps its own.
    named = system.config.parent / "contexts" / f"{system.up.state.name}.json"
    assert json.loads(named.read_text())["url"] == system.up.url()
    assert stat.S_IMODE(named.stat().st_mode) == 0o600
    assert f"--context {system.up.state.name}: {named}" in system.up.text()
    r = system.karios("--context", system.up.state.name, "-o", "json", "context", "show")
    assert r.returncode == 0 and json.loads(r.stdout)["url"] == system.up.url(), r.stderr
    assert system.karios("--context", system.up.state.name, "jobs").returncode == 0
    nope = system.karios("jobs", KARIOS_CONTEXT="no-such-system")
    assert nope.returncode == 2 and "no context 'no-such-system'" in nope.stderr

    other = system.root / "other.json"
    r = system.karios("login", system.up.url(), "--token", system.up.token, KARIOS_CONFIG=str(other))
    assert r.returncode == 0, r.stderr
    assert "as bootstrap-admin (fabric_admin)" in r.stdout
    assert stat.S_IMODE(other.stat().st_mode) == 0o600

    bad = system.karios("login", system.up.url(), "--token", "kt_wrong", KARIOS_CONFIG=str(other))
    assert bad.returncode == 3 and "rejected the token" in bad.stderr and "Traceback" not in bad.stderr
    down = system.karios("login", "http://127.0.0.1:9", "--token", "kt_x", KARIOS_CONFIG=str(other))
    assert down.returncode == 2 and "cannot reach the gateway at http://127.0.0.1:9" in down.stderr
    assert "Traceback" not in down.stderr


def test_tokens_are_managed_through_the_gateway_and_roles_hold(system: System):
    r = system.karios("token", "create", "cli-viewer", "--role", "viewer")
    assert r.returncode == 0, r.stderr
    viewer = r.stdout.strip()
    assert viewer.startswith("kt_")
    listed = json.loads(system.karios("--output", "json", "token", "list").stdout)
    assert {"name": "cli-viewer", "role": "viewer"}.items() <= next(
        t for t in listed if t["name"] == "cli-viewer"
    ).items()
    assert all("token" not in t and "token_hash" not in t for t in listed)

    # A viewer reads but may not provision; the error names what was refused.
    assert system.karios("jobs", KARIOS_TOKEN=viewer).returncode == 0
    denied = system.karios("provision", BMCS[0], KARIOS_TOKEN=viewer)
    assert denied.returncode == 3 and "not allowed" in denied.stderr and "Traceback" not in denied.stderr

    assert system.karios("token", "revoke", "cli-viewer").returncode == 0
    gone = system.karios("jobs", KARIOS_TOKEN=viewer)
    assert gone.returncode == 3 and "rejected the token" in gone.stderr


def _job_show(system: System, job_id: str) -> dict:
    return json.loads(system.karios("--output", "json", "job", "show", job_id).stdout)  # type: ignore[no-any-return]


def _job_shown(system: System, job_id: str, status: str, timeout: float = 30) -> dict:
    """``karios job show`` once it says ``status``: for an end the CLI did not wait for (a
    cancel answers 202 before the job is cancelled)."""

    def shown() -> dict:
        j = _job_show(system, job_id)
        return j if j["status"] == status else {}

    return wait_until_sync(shown, timeout=timeout, interval=0.5, what=f"job show: {status}")  # type: ignore[no-any-return]


def test_provision_watch_to_completion_with_the_installer_callbacks(system: System):
    watcher = system.popen("provision", BMCS[0], "--hostname", "cli-a", "--watch")
    try:
        job_id = ""

        def accepted() -> bool:
            nonlocal job_id
            jobs = json.loads(system.karios("--output", "json", "jobs").stdout)
            mine = [e for e in jobs["entries"] if e["bmc_ip"] == BMCS[0]]
            job_id = mine[0]["job_id"] if mine else ""
            return bool(mine) and mine[0]["state"] in ("booting", "installing")

        wait_until_sync(accepted, timeout=120, interval=0.5, what="the job to reach booting")
        token, _ = medium_token(system.medium_url(job_id))
        h = {"X-Karios-Job-Token": token}
        with httpx.Client(base_url=system.up.url(), timeout=10) as c:
            for step in ("network", "partitioning", "packages"):
                r = c.post(f"/controlnode/job/{job_id}/step", json={"step": step, "state": "done"}, headers=h)
                assert r.status_code == 200, r.text
            r = c.post(f"/controlnode/job/{job_id}/complete", json={"os_ip": "10.96.1.1"}, headers=h)
            assert r.status_code == 200, r.text
            r = c.post("/controlnode/firstboot", json={"bmc_ip": BMCS[0], "os_ip": "10.96.1.1"}, headers=h)
            assert r.status_code == 200, r.text
        out, _ = watcher.communicate(timeout=90)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, out
    assert f"job {job_id} accepted for {BMCS[0]}" in out
    for state in ("booting", "installing", "completed"):
        assert state in out, out
    assert "Traceback" not in out
    # The last screen of `karios provision --watch`, kept for the docs (path: KARIOS_CLI_SCREEN).
    Path(os.environ.get("KARIOS_CLI_SCREEN", "/tmp/karios-provision-watch.txt")).write_text(out)

    # The watch ended once the gateway's job view agreed with its last event: read at once.
    job = _job_show(system, job_id)
    assert job["status"] == "completed", job
    assert job["bmc_ip"] == BMCS[0]

    # Its first boot registered it as a compute node.
    listed = system.karios("nodes")
    assert listed.returncode == 0 and "10.96.1.1" in listed.stdout and "firstboot" in listed.stdout
    node = json.loads(system.karios("--output", "json", "nodes", "show", "10.96.1.1").stdout)
    assert node["bmc_ip"] == BMCS[0]


def test_adopting_an_unreachable_node_is_one_line_naming_it(system: System):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "karios.cli",
            "nodes",
            "adopt",
            "127.0.0.1",
            "--port",
            "9",
            "--password-stdin",
        ],
        input="pw-not-used\n",
        env=system.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "127.0.0.1" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "pw-not-used" not in r.stderr + r.stdout
    assert "127.0.0.1" not in system.karios("nodes").stdout


def test_watch_exits_non_zero_when_the_job_fails_and_says_why(system: System):
    r = system.karios("provision", DEAD_BMC, "--watch", timeout=180, COLUMNS="80")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failed" in r.stdout and DEAD_BMC in r.stdout
    job_id = re.search(r"job (\S+) accepted for", r.stdout).group(1)  # type: ignore[union-attr]
    shown = _job_show(system, job_id)  # the watch ended once the job view said failed too
    assert shown["status"] == "failed", shown
    reason = shown["message"]
    assert len(reason) > 20, reason
    # The per-line output says why (not only "Failed"), the summary keeps the whole reason and
    # the whole id, even at 80 columns in a pipe.
    failed = [line for line in r.stdout.splitlines() if DEAD_BMC in line and " failed " in line]
    assert failed and reason in failed[0], r.stdout
    summary = r.stdout.split("jobs")[-1]
    assert job_id in summary and reason in summary and "…" not in summary, r.stdout


def test_until_cancel_and_unprovision(system: System):
    r = system.karios("provision", BMCS[1], "--watch", "--until", "booting", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = next(
        e["job_id"]
        for e in json.loads(system.karios("--output", "json", "jobs").stdout)["entries"]
        if e["bmc_ip"] == BMCS[1]
    )
    c = system.karios("job", "cancel", job_id[:8])  # a unique prefix is enough
    assert c.returncode == 0, c.stderr
    assert job_id in c.stdout  # a pipe gets the whole id
    _job_shown(system, job_id, "cancelled", timeout=60)
    u = system.karios("--output", "json", "unprovision", BMCS[1])
    assert u.returncode == 0, u.stderr
    wipe_id = json.loads(u.stdout)["job_id"]
    wipe = json.loads(system.karios("--output", "json", "job", "show", wipe_id).stdout)
    assert wipe["job_type"] == "unprovision" and wipe["bmc_ip"] == BMCS[1]
    system.karios("job", "cancel", wipe_id)  # (it may have ended already: the BMC is free again)
    # --watch says it was accepted (like provision) and, here, why it failed.
    dead = system.karios("unprovision", DEAD_BMC, "--watch", timeout=180)
    assert dead.returncode == 1, dead.stdout + dead.stderr
    assert re.search(rf"^job \S+ accepted for {re.escape(DEAD_BMC)}$", dead.stdout, re.M), dead.stdout
    assert any(DEAD_BMC in x and " failed " in x and "Failed:" in x for x in dead.stdout.splitlines())

    bogus = system.karios("provision", BMCS[1], "--watch", "--until", "bogus")
    assert bogus.returncode == 2 and "'bogus' is not a job state" in bogus.stderr

    # History: ended jobs too, newest first, every id whole in a pipe.
    h = system.karios("jobs", "--all", "--since", "1h", COLUMNS="80")
    assert h.returncode == 0 and job_id in h.stdout and wipe_id in h.stdout, h.stdout + h.stderr
    assert system.karios("jobs").stdout.count(job_id) == 0  # the queue has only active jobs


GAP = 6.0  # seconds between `jobs --watch` opening its stream and the job it must follow


def test_jobs_watch_follows_a_job_started_after_it(system: System):
    proc = system.popen("jobs", "--watch")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        wait_until_sync(lambda: any("Ctrl-C stops" in x for x in lines), timeout=90, interval=0.2,
                        what="jobs --watch to start")  # fmt: skip
        time.sleep(GAP)  # its event stream is open; the watch is now GAP s older than any new job
        t_post = time.monotonic()
        r = system.karios("provision", BMCS[2], "--watch", "--until", "booting", timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        job_id = re.search(r"job (\S+) accepted for", r.stdout).group(1)  # type: ignore[union-attr]
        wait_until_sync(
            lambda: any(job_id in x and "booting" in x for x in lines),
            timeout=120,
            interval=0.2,
            what="jobs --watch to show the new job at booting",
        )
        since_post = time.monotonic() - t_post
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        reader.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert "Traceback" not in out, out
    mine = [x for x in lines if job_id in x and BMCS[2] in x and "%" in x]
    assert mine, out
    # elapsed from the job's own start, not the watch's (which began GAP s before the job): on a
    # loaded machine the job may take minutes to reach booting, so compare with the clock here.
    elapsed = [float(m) for x in mine for m in re.findall(r"(\d+\.\d)s", x)]
    assert elapsed and max(elapsed) < since_post + GAP / 2, (since_post, mine)
    assert job_id in out.split("jobs")[-1]  # the summary table on Ctrl-C
    assert system.karios("job", "cancel", job_id).returncode == 0


def test_the_readmes_read_only_examples_run(system: System):
    """The README's `karios …` examples that only read (fabric plan/preflight, job history, JSON and
    wide output) answer 0 against a real system; the others are parsed by tests/unit/cli."""
    ran = []
    for argv in readme_client_examples():
        if argv[:2] in (["fabric", "plan"], ["fabric", "preflight"], ["jobs", "--all"], ["-o", "json"],
                        ["-o", "wide"]):  # fmt: skip
            r = system.karios(*argv, timeout=120)
            assert r.returncode == 0, (argv, r.stdout, r.stderr)
            ran.append(argv[:2])
    assert ["fabric", "plan"] in ran and ["fabric", "preflight"] in ran, ran


def test_unknown_bmc_and_bad_input_are_one_readable_line(system: System):
    r = system.karios("provision", "10.95.0.1")
    assert r.returncode == 1 and "404" in r.stderr and "Traceback" not in r.stderr
    r = system.karios("provision", "not-an-ip")
    assert r.returncode == 1 and "422" in r.stderr and "bmc_IP" in r.stderr


def test_events_and_fabric_verbs(system: System):
    # A job that fails at once gives the stream something to replay, even when run alone.
    assert system.karios("provision", DEAD_BMC, "--watch", timeout=180).returncode == 1
    proc = system.popen("events", "--channel", "provision", "--since", "0")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        wait_until_sync(
            lambda: any(DEAD_BMC in x and "failed" in x for x in lines),
            timeout=30,
            interval=0.2,
            what="the failed job's events replayed",
        )
    finally:
        proc.kill()
        reader.join(5)
    events = [json.loads(x) for x in lines if x.strip()]
    assert all("event" in e and "data" in e for e in events)
    assert any(e["data"].get("data", {}).get("bmc_ip") == DEAD_BMC for e in events), events[:3]
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)  # in stream order

    plan = system.karios(
        "--output",
        "json",
        "fabric",
        "plan",
        "fabric_switch_nos=sonic",
        "management_cidr=10.96.0.0/24",
        "vxlan_mtu=9000",
    )
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["plan_hash"]
    bad = system.karios(
        "fabric", "plan", "fabric_switch_nos=sonic", "management_cidr=banana", "vxlan_mtu=9000"
    )
    assert bad.returncode == 1 and "management_cidr" in bad.stderr
    missing = system.karios("fabric", "show")
    assert missing.returncode == 1 and "404" in missing.stderr


def test_the_bmc_is_reached_at_the_inventorys_address_port_and_system(system: System):
    """No KARIOS_PROVISIONER_BMC_ENDPOINTS entry: the inventory record says where the BMC is, the
    registry holds its credentials (registered like an operator would)."""
    sid = system.emu.system_ids[-1]
    with httpx.Client(base_url=system.up.url(), timeout=10) as c:
        r = c.post(
            "/controlnode/register",
            json={
                "bmc_ip": INVENTORY_BMC,
                "bmc_username": system.emu.username,
                "bmc_password": system.emu.password,
            },
            headers={"Authorization": f"Bearer {system.up.token}"},
        )
        assert r.status_code == 200, r.text
    before = inserts_seen(system.emu, sid)
    r = system.karios("provision", INVENTORY_BMC, "--watch", "--until", "booting", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert inserts_seen(system.emu, sid) == before + 1  # the medium went into that very system
    status, cd = system.emu.request("GET", f"/redfish/v1/Systems/{sid}/VirtualMedia/Cd")
    assert status == 200 and cd and cd.get("Inserted") is True, cd
