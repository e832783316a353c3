"""Upgrade from the previous release (issue 26 item 3; docs/production.md "Upgrades").

The previous release — the git tag ``karios-previous`` if this clone has it, else the commit
pinned below — is checked out beside this one (``git worktree add``) with its own environment
(``uv sync --locked``). Its ``karios up`` writes data on a fresh state directory: an API token, a
BMC registered with its password, a fabric config with a BGP password and an OSPF key, and a
provision job run to the end (installer callbacks, first boot: a compute node). It has no audit
trail yet, so no audit rows. Stopped, the directory is backed up (``karios backup``).

Then this checkout's ``karios up`` starts on the same directory: every schema migrates forward,
and the data is there and usable — the old token authenticates, the nodes and the job (with its
events) are listed, the stored secrets decrypt (the same BGP password is recognised, a new one
goes through the switch ack gate with its hash, the BMC password of the old registry row logs in
for an inspection), and what the previous release did not have (``GET /controlnode/jobs``, the
audit trail, inspection) works on the old data.

The way back: the previous release started on the upgraded directory is refused (its services
cannot find the newer Alembic revisions, ``karios up`` gives up) and leaves it as it was (this
checkout starts on it again, everything in place); a rollback is the backup restored into a fresh
directory, where the previous release starts and finds everything as before the upgrade.

The phases' times are printed and written to ``$KARIOS_MEASURE_DIR/upgrade.txt``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.chaos import KariosUp, http_get, http_post, provision_events, state_dir
from tests.fixtures.fabric import SWITCH_RR
from tests.fixtures.provision import bmc_state, medium_token, write_inventory
from tests.fixtures.wait import wait_until_sync
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = pytest.mark.lab  # the Redfish emulator (the lab's cached sushy-tools venv)

REPO = Path(__file__).resolve().parents[2]
#: The previous release: this tag when it exists (moved at each release), else the commit below.
PREVIOUS_TAG = "karios-previous"
#: The last landed release (the last commit whose CI passed) before the upgrade test existed.
PREVIOUS_COMMIT = "c12e4ba5f7b47038e0551e78e7003228374e9d63"

BMC_A = "10.95.0.1"  # provisioned by the old release (credentials in KARIOS_PROVISIONER_BMC_ENDPOINTS)
BMC_B = "10.95.0.2"  # registered with the old release: its BMC password is only in the registry
OS_A, OS_B = "10.95.1.1", "10.95.1.2"
FABRIC = {
    **SWITCH_RR,  # the switch runs BGP: a new BGP password goes through the switch ack gate
    "bgp_password": "bgp-upgr4de-pw",
    "ospf_auth_type": "message-digest",
    "ospf_fabric_interface": "eth1",
    "ospf_auth_key": "ospfK3y",
    "ospf_auth_key_id": 7,
}
TIMES: dict[str, float] = {}


def ok(answer: tuple[int, bytes, dict[str, str]], want: int = 200) -> dict:
    status, body, _ = answer
    assert status == want, f"{status} {body[:800]!r}"
    return json.loads(body)  # type: ignore[no-any-return]


def git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def previous_ref() -> str:
    """The tag if this clone has it, else the pinned commit; skips when neither is here."""
    if shutil.which("git") is None or git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("the upgrade test needs git and a git checkout (it checks out the previous release)")
    for ref in (PREVIOUS_TAG, PREVIOUS_COMMIT):
        if git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode == 0:
            return ref
    shallow = git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
    why = "this is a shallow clone" if shallow else "this clone does not have them"
    pytest.skip(
        f"the previous release (tag {PREVIOUS_TAG}, else commit {PREVIOUS_COMMIT}) is not here: {why} "
        f"(git fetch --unshallow, or git fetch origin tag {PREVIOUS_TAG})"
    )


def uv_binary() -> str:
    found = os.environ.get("UV") or shutil.which("uv") or str(Path.home() / ".local/bin/uv")
    if not Path(found).is_file():
        pytest.skip("uv is not installed: the previous release's environment is built with `uv sync`")
    return found


@contextlib.contextmanager
def previous_release(root: Path) -> Iterator[Path]:
    """The previous release checked out at ``root`` with its environment (``root/.venv``)."""
    ref, uv = previous_ref(), uv_binary()
    t0 = time.monotonic()
    added = git("worktree", "add", "--detach", str(root), ref)
    assert added.returncode == 0, added.stderr
    try:
        TIMES["worktree"] = time.monotonic() - t0
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
        t0 = time.monotonic()
        # Compiled as scripts/test.sh compiles this checkout's (PYTHONDONTWRITEBYTECODE is set on
        # some machines: every service process would compile every module at each start).
        for argv in (
            [uv, "sync", "--locked", "--all-packages", "--quiet", "--compile-bytecode"],
            [str(root / ".venv/bin/python"), "-m", "compileall", "-q", "libs", "services", "cli"],
        ):
            done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        TIMES["uv sync --compile-bytecode"] = time.monotonic() - t0
        commit = git("rev-parse", "--short", "HEAD", cwd=root).stdout.strip()
        print(f"previous release {ref} ({commit}) at {root}")
        yield root
    finally:
        if git("worktree", "remove", "--force", str(root)).returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            git("worktree", "prune")


def old_up(release: Path, state: Path, env: dict[str, str], *args: str) -> KariosUp:
    venv = release / ".venv"
    path = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    return KariosUp(
        state,
        *args,
        env={**env, "VIRTUAL_ENV": str(venv), "PATH": path},
        python=str(venv / "bin/python"),
        cwd=release,
    )


def started(up: KariosUp, phase: str) -> KariosUp:
    TIMES[phase] = up.wait_started()
    return up


def job_of(up: KariosUp, job_id: str) -> dict:
    return ok(http_get(f"{up.url()}/controlnode/job/{job_id}", up.token))


def provision_to_the_end(up: KariosUp, token: str, emu: RedfishEmulator) -> str:
    """A provision job on BMC_A through the installer's callbacks and first boot (a compute node)."""
    body = {"bmc_IP": BMC_A, "vendor": "generic", "hostname": "upgrade-a", "os_password": "pw-upgrade"}
    job_id = ok(http_post(f"{up.url()}/controlnode/provision", body, token, timeout=30), 202)["job_id"]
    wait_until_sync(
        lambda: job_of(up, job_id)["job_status"] in ("booting", "installing"),
        timeout=120,
        interval=0.5,
        what="the old release's job to reach booting",
    )
    # The medium's URL as the BMC got it (unsigned before the media URLs were signed).
    images = [bmc_state(emu, sid)["image"] for sid in emu.system_ids]
    job_token, _ = medium_token(next(i for i in images if f"/media/{job_id}.iso" in i))
    headers = {"X-Karios-Job-Token": job_token, "Content-Type": "application/json"}

    def post(path: str, payload: dict) -> None:
        req = urllib.request.Request(
            f"{up.url()}/controlnode/{path}",
            data=json.dumps(payload).encode(),
            headers=headers,
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200, r.read()

    for step in ("network", "partitioning", "packages"):
        post(f"job/{job_id}/step", {"step": step, "state": "done"})
    post(f"job/{job_id}/complete", {"os_ip": OS_A})
    post("firstboot", {"bmc_ip": BMC_A, "os_ip": OS_A})
    wait_until_sync(
        lambda: job_of(up, job_id)["status"] == "completed",
        timeout=60,
        interval=0.5,
        what="the job to complete",
    )
    return job_id


def snapshot(up: KariosUp, job_id: str) -> dict:
    """What an operator reads back: nodes, the job, the fabric config, the tokens."""
    gw, admin = up.url(), up.token
    return {
        "nodes": ok(http_get(f"{gw}/controlnode/nodes", admin)),
        "job": job_of(up, job_id),
        "fabric": ok(http_get(f"{gw}/controlnode/fabric-config", admin)),
        "tokens": ok(http_get(f"{gw}/controlnode/tokens", admin)),
    }


def assert_kept(old: object, new: object, where: str = "") -> None:
    """Everything ``old`` held is in ``new`` with the same value (a newer release may add fields)."""
    if isinstance(old, dict):
        assert isinstance(new, dict), f"{where}: {new!r}"
        for key, value in old.items():
            assert key in new, f"{where}.{key} is gone"
            assert_kept(value, new[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), f"{where}: {old!r} -> {new!r}"
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            assert_kept(a, b, f"{where}[{i}]")
    else:
        assert old == new, f"{where}: {old!r} -> {new!r}"


def fabric_post(up: KariosUp, body: dict, token: str) -> tuple[int, dict]:
    status, raw, _ = http_post(f"{up.url()}/controlnode/fabric-config", body, token, timeout=30)
    return status, json.loads(raw)


def record(lines: list[str]) -> None:
    print("\n[measure] upgrade from the previous release\n" + "\n".join(lines))
    out = os.environ.get("KARIOS_MEASURE_DIR")
    if out:  # scripts/test.sh prints these tables at the end of the CI log
        os.makedirs(out, exist_ok=True)
        Path(out, "upgrade.txt").write_text("\n".join(lines) + "\n")


@dataclass
class Written:
    """What the previous release wrote, as its API answered it."""

    ops_token: str
    job_id: str
    before: dict


@pytest.mark.timeout(600)  # ~100 s on the 2-core machine at load 4; 440 s at load 14
def test_upgrade_from_the_previous_release_keeps_everything_and_refuses_the_way_back():
    t_all = time.monotonic()
    emu = RedfishEmulator([fake_system("upgrade-a"), fake_system("upgrade-b")]).start()
    try:
        with state_dir("karios-upgrade-") as root:
            env = {
                "KARIOS_INVENTORY_FILE": str(write_inventory(root / "inventory.yaml", [BMC_A, BMC_B])),
                "KARIOS_PROVISIONER_BMC_ENDPOINTS": json.dumps(
                    {
                        BMC_A: {
                            "url": emu.url,
                            "system_id": emu.system_ids[0],
                            "username": emu.username,
                            "password": emu.password,
                        },
                        BMC_B: {"url": emu.url, "system_id": emu.system_ids[1]},  # no credentials here
                    }
                ),
                "KARIOS_PROVISIONER_INSTALL_METHOD": "preseed",
                "KARIOS_PROVISIONER_BMC_RETRIES": "1",
                "KARIOS_PROVISIONER_BMC_BACKOFF": "0.1",
            }
            state, archive = root / "state", root / "before-upgrade.tar.gz"
            with previous_release(root / "previous") as release:
                written = write_with_the_previous_release(release, state, env, emu)
                # Step 1 of the procedure: back up the stopped system. The previous release has no
                # `karios backup`; this one's reads its state directory (and migrates nothing).
                t0 = time.monotonic()
                done = karios("backup", "--state-dir", str(state), "--out", str(archive))
                assert done.returncode == 0, done.stdout + done.stderr
                TIMES["karios backup (this checkout)"] = time.monotonic() - t0
                after = upgrade_and_find_everything(state, env, written, emu)
                refuse_the_previous_release(release, state, env)
                still_everything_there(state, env, written, after)
                roll_back_by_restoring(release, root / "rolled-back", archive, env, written)
    finally:
        emu.stop()
    TIMES["total"] = time.monotonic() - t_all
    record([f"{phase:<38} {seconds:6.1f} s" for phase, seconds in TIMES.items()])


def karios(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """This checkout's CLI (``extra``: environment variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")} | extra
    return subprocess.run(
        [sys.executable, "-m", "karios.cli", *args], env=env, capture_output=True, text=True, timeout=180
    )


def write_with_the_previous_release(
    release: Path, state: Path, env: dict[str, str], emu: RedfishEmulator
) -> Written:
    """A token, a registered BMC with its password, a fabric config with secrets, a job run to
    first boot (a compute node). The previous release has no audit trail to write rows to."""
    up = started(old_up(release, state, env), "previous release: start (initdb)")
    try:
        t0 = time.monotonic()
        gw, admin = up.url(), up.token
        ops = ok(
            http_post(f"{gw}/controlnode/tokens", {"name": "upgrade-ops", "role": "operator"}, admin), 201
        )
        registered = {
            "bmc_ip": BMC_B,
            "os_ip": OS_B,
            "os_hostname": "upgrade-b",
            "bmc_username": emu.username,
            "bmc_password": emu.password,
        }
        assert ok(http_post(f"{gw}/controlnode/register", registered, admin))["success"] is True
        ok(http_post(f"{gw}/controlnode/fabric-config", FABRIC, admin, timeout=30), 201)
        job_id = provision_to_the_end(up, ops["token"], emu)
        before = snapshot(up, job_id)
        TIMES["previous release: writes"] = time.monotonic() - t0
    finally:
        assert up.stop() == 0, up.text()
    listed = {n["node_ip"]: n for n in before["nodes"]["items"]}
    assert listed[OS_A]["source"] == "firstboot" and listed[OS_A]["bmc_ip"] == BMC_A, listed
    assert listed[OS_B]["source"] == "registry" and listed[OS_B]["bmc_ip"] == BMC_B, listed
    assert before["fabric"]["bgp_password_is_set"] and before["fabric"]["ospf_auth_key_is_set"]
    return Written(ops["token"], job_id, before)


def upgrade_and_find_everything(state: Path, env: dict[str, str], w: Written, emu: RedfishEmulator) -> dict:
    """This checkout on the same state directory: every schema migrates forward (the audit
    trail and the hardware records below are tables of the new revisions), and the old data is
    there and usable. Returns what it reads back at the end."""
    up = started(KariosUp(state, env=env), "this checkout: start (migrations)")
    try:
        t0 = time.monotonic()
        gw, admin = up.url(), up.token
        who = ok(http_get(f"{gw}/controlnode/tokens/self", w.ops_token))
        assert (who["name"], who["role"]) == ("upgrade-ops", "operator"), who
        after = snapshot(up, w.job_id)
        assert_kept(w.before, after)
        assert after["job"]["status"] == "completed" and after["job"]["bmc_ip"] == BMC_A
        # The job's history: its events are still in the stream, and the jobs list (a route the
        # previous release did not have) has it.
        seen = provision_events(up, b'"completed"')
        assert w.job_id.encode() in seen and b"booting" in seen and b"completed" in seen, seen[-2000:]
        page = ok(http_get(f"{gw}/controlnode/jobs?id_prefix={w.job_id}", w.ops_token))
        assert [j["id"] for j in page["items"]] == [w.job_id], page
        cli = karios("--output", "json", "nodes", KARIOS_CONFIG=str(state / "client.json"))
        assert cli.returncode == 0 and OS_A in cli.stdout and OS_B in cli.stdout, cli.stdout + cli.stderr

        # The stored secrets decrypt with the key ring the previous release wrote: the same BGP
        # password again is no change (compared decrypted) ...
        status, same = fabric_post(up, {"bgp_password": FABRIC["bgp_password"]}, w.ops_token)
        assert status == 200, same
        # ... a new one must be acked on the switch first: the gate renders the stored config.
        change = {"bgp_password": "bgp-after-upgrade"}
        status, gate = fabric_post(up, change, w.ops_token)
        assert status == 409 and gate["code"] == "REQUIRES_SWITCH_RECONFIG_ACK", gate
        assert gate["details"]["changed_fields"] == ["bgp_password"], gate
        eos = next(s for s in gate["details"]["snippets"] if s["nos"] == "eos")
        ack = {"switch_acked": True, "switch_nos": "eos", "acked_by": "netops"}
        status, acked = fabric_post(
            up, {**change, **ack, "switch_snippet_hash": eos["switch_snippet_hash"]}, w.ops_token
        )
        assert status == 200 and acked["bgp_password_is_set"], acked
        # The BMC password of the old registry row logs in: an inspection (new) of BMC_B.
        # (The emulator answers 401 to any other credentials: the inspection would be a 422.)
        hw = ok(http_post(f"{gw}/controlnode/bmc/{BMC_B}/inspect", {}, w.ops_token, timeout=90))
        assert hw["bmc_ip"] == BMC_B and hw["system"]["redfish_id"].endswith(emu.system_ids[1]), hw

        # The audit trail (new) records the writes made since the upgrade.
        def audited() -> list[tuple[str, str]]:
            recs = ok(http_get(f"{gw}/controlnode/audit?actor=upgrade-ops", admin))["records"]
            return [(r["method"], r["route"]) for r in recs]

        wait_until_sync(
            lambda: (
                ("POST", "/controlnode/bmc/{bmc_ip}/inspect") in audited()
                and audited().count(("POST", "/controlnode/fabric-config")) == 3
            ),
            timeout=20,
            interval=0.5,
            what="the audit trail to list the writes since the upgrade",
        )
        TIMES["this checkout: checks"] = time.monotonic() - t0
        return snapshot(up, w.job_id)
    finally:
        assert up.stop() == 0, up.text()


def newer_revisions(release: Path) -> list[str]:
    """The migrations this checkout has and the previous release has not."""
    pattern = "services/*/src/karios/*/migrations/versions/*.py"
    theirs = {p.relative_to(release) for p in release.glob(pattern)}
    return sorted(str(p) for p in (p.relative_to(REPO) for p in REPO.glob(pattern)) if p not in theirs)


def refuse_the_previous_release(release: Path, state: Path, env: dict[str, str]) -> None:
    """The previous release on the upgraded directory: its services cannot find the newer
    revisions, and `karios up` gives up (at the first crash here; by default after five).
    (Right after a release, when no schema changed since, it simply runs.)"""
    if not newer_revisions(release):
        up = started(old_up(release, state, env), "previous release on it: same schema, runs")
        assert up.stop() == 0, up.text()
        return
    print("migrations since the previous release:", ", ".join(newer_revisions(release)))
    t0 = time.monotonic()
    down = old_up(release, state, env, "--max-crashes", "1")
    try:
        code = down.proc.wait(180)
    finally:
        down.stop()
    assert code == 1, down.text()
    TIMES["previous release on it: refused"] = time.monotonic() - t0
    said = down.text()
    assert "failed to start" in said and "Ctrl-C stops everything" not in said, said
    refusals = {
        f"{log.name}: {m.group(0)}"
        for log in (state / "logs").glob("*.log")
        for m in re.finditer(r"Can't locate revision identified by '[^']+'", log.read_text(errors="replace"))
    }
    assert refusals, f"no service log names the unknown revision: {said}"
    print("the previous release on the upgraded state directory:")
    print("\n".join(line for line in said.splitlines() if "failed to start" in line))
    print("\n".join(sorted(refusals)))


def still_everything_there(state: Path, env: dict[str, str], w: Written, after: dict) -> None:
    """... and the refused start left the directory as it was: this checkout starts on it."""
    up = started(KariosUp(state, env=env), "this checkout: start again")
    try:
        assert ok(http_get(f"{up.url()}/controlnode/tokens/self", w.ops_token))["name"] == "upgrade-ops"
        assert snapshot(up, w.job_id) == after
    finally:
        assert up.stop() == 0, up.text()


def roll_back_by_restoring(
    release: Path, target: Path, archive: Path, env: dict[str, str], w: Written
) -> None:
    """A rollback: the backup taken before the upgrade, restored into a fresh directory (this
    checkout's `karios restore`: the previous release has none; a restore migrates nothing) and
    the previous release started on it: everything as it was before the upgrade."""
    t0 = time.monotonic()
    done = karios("restore", "--state-dir", str(target), str(archive))
    assert done.returncode == 0, done.stdout + done.stderr
    TIMES["karios restore (this checkout)"] = time.monotonic() - t0
    up = started(old_up(release, target, env), "previous release: start on the restore")
    try:
        assert ok(http_get(f"{up.url()}/controlnode/tokens/self", w.ops_token))["name"] == "upgrade-ops"
        assert snapshot(up, w.job_id) == w.before
    finally:
        assert up.stop() == 0, up.text()
