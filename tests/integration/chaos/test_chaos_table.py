"""The chaos table (issue 12): faults during real work, and nothing lost or duplicated.

One ``karios up`` system on a PRIVATE nats-server and a PRIVATE PostgreSQL (faults never touch
the machine's servers), five BMCs on the sushy-tools Redfish emulator and, with root, the
3-node namespace fabric lab. Each fault runs during all three workloads at once:

- W1: 5 provisions (one per emulated BMC), driven to ``completed`` by playing the installer;
- W2: 200 registrations of distinct nodes;
- W3: one fabric apply to the 3 lab nodes (skipped without the lab, with the reason).

Faults, one after another on the same system: SIGKILL of each service (``karios up`` restarts
it), NATS stopped for 30 s then restarted, PostgreSQL SIGSTOPped for 10 s. Counts are checked
against the ground truth (the database, the emulator's own request log); lost and duplicated
must be 0. The table is printed (``-s``) and written to ``$KARIOS_CHAOS_TABLE``
(default ``/tmp/karios-chaos-table.md``), section ``shared``; the faults that take the system
itself down (a full disk, a taken port, a SIGKILLed ``karios up``) run on a system of their own in
``test_chaos_restarts.py``, which writes its section of the same file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.chaos import KariosUp, PrivateNats, PrivatePostgres, http_get, state_dir
from tests.fixtures.chaos_jobs import Bmc, FabricApply, Provisions, system_env
from tests.fixtures.chaos_work import Api, Db, Registrations, Row, render_table, write_table_section
from tests.fixtures.fabric import lab_config
from tests.fixtures.provision import write_inventory
from tests.fixtures.wait import wait_until_sync
from tests.lab.redfish_lab import RedfishEmulator, fake_system

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
SERVICES = ("api-gateway", "provisioner", "inventory", "fabric-worker", "bootapi")
FAULTS = [*(f"SIGKILL {s}" for s in SERVICES), "NATS stopped 30 s", "PostgreSQL SIGSTOP 10 s"]
TABLE = Path(os.environ.get("KARIOS_CHAOS_TABLE", "/tmp/karios-chaos-table.md"))
LOGS = TABLE.with_name(TABLE.stem + "-logs")
NATS_OUTAGE_S = 30.0
PG_PAUSE_S = 10.0
BMC_IPS = [f"10.96.0.{i}" for i in range(1, 6)]
FABRIC_BMCS = [f"198.18.3.{i}" for i in (1, 2, 3)]
#: W1's installed hosts exist only as emulated BMCs: their OS addresses (the installer's
#: callbacks record them) would make them fabric nodes no SSH reaches. W3 rolls out the lab only.
FORGET_INSTALLED_HOSTS = (
    "DO $$ BEGIN "
    "UPDATE inventory.bmc_infos SET os_ip = NULL WHERE bmc_ip LIKE '10.96.0.%'; "
    "IF to_regclass('inventory.compute_nodes') IS NOT NULL THEN "
    "DELETE FROM inventory.compute_nodes WHERE bmc_ip LIKE '10.96.0.%'; END IF; END $$"
)
# The lab configuration, with the switch ack gate left on (its default).
FABRIC_CONFIG = lab_config(skip_switch_ack=False)


@dataclass
class System:
    up: KariosUp
    nats: PrivateNats
    pg: PrivatePostgres
    emu: RedfishEmulator
    db: Db
    api: Api
    bmcs: list[Bmc]
    lab: fabric_lab.FabricLab | None
    lab_skip: str


def _env(nats: PrivateNats, db_url: str, emu: RedfishEmulator, inventory: Path, lab) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = {
        **system_env(emu, BMC_IPS, inventory),
        "KARIOS_NATS_URL": nats.url,
        "KARIOS_DATABASE_URL": db_url,
        "KARIOS_FABRIC_CONNECT_TIMEOUT": "5",
        "KARIOS_FABRIC_VERIFY_TIMEOUT": "30",
        "KARIOS_FABRIC_HEARTBEAT_INTERVAL": "1",
        "KARIOS_FABRIC_DRIFT_INTERVAL": "0",
    }
    if lab is not None:
        env["KARIOS_FABRIC_SSH_KEY"] = lab.client_key_path
    return env


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with state_dir("karios-chaos-table-") as root, contextlib.ExitStack() as stack:
        try:
            emu = RedfishEmulator([fake_system(f"node{i}") for i in range(1, 6)], auth=True).start()
        except Exception as exc:  # pragma: no cover - depends on the machine
            if CI:
                pytest.fail(f"sushy-tools emulator required in CI: {exc}", pytrace=False)
            pytest.skip(f"sushy-tools emulator unavailable: {exc}")
        stack.callback(emu.stop)
        lab, lab_skip = None, fabric_lab.skip_reason() or ""
        if lab_skip and CI:
            pytest.fail(f"fabric lab required in CI: {lab_skip}", pytrace=False)
        if not lab_skip:
            lab = fabric_lab.FabricLab(n_nodes=3, prefix="kc").start()
            stack.callback(lab.stop)
        nats = PrivateNats(root)
        nats.start()
        stack.callback(nats.stop)
        pg = PrivatePostgres(root)
        db_url = pg.start().replace("/postgres?", "/karios?")
        stack.callback(pg.stop)
        inventory = write_inventory(root / "inventory.yaml", BMC_IPS)
        up = KariosUp(root / "state", env=_env(nats, db_url, emu, inventory, lab))
        stack.callback(up.stop)
        up.wait_started()
        api = Api(up.url(), up.token)
        if lab is not None:
            for bmc, node in zip(FABRIC_BMCS, lab.nodes, strict=True):
                body = {"bmc_ip": bmc, "os_ip": node.underlay_ip, "os_username": "root", "fqdn": node.name}
                assert api.post("/controlnode/register", body).status == 200
            assert api.post("/controlnode/fabric-config", FABRIC_CONFIG).status in (200, 201)
        bmcs = [Bmc(ip, sid) for ip, sid in zip(BMC_IPS, emu.system_ids, strict=True)]
        stack.callback(_keep_logs, up)
        yield System(up, nats, pg, emu, Db(db_url), api, bmcs, lab, lab_skip)


def _keep_logs(up: KariosUp) -> None:
    """The services' logs outlive the state directory (for a failure's details)."""
    shutil.rmtree(LOGS, ignore_errors=True)
    shutil.copytree(up.state / "logs", LOGS, dirs_exist_ok=True)
    (LOGS / "karios-up.console").write_text(up.text())


@pytest.fixture(scope="module")
def table(system: System) -> Iterator[tuple[list[Row], dict[str, float]]]:
    rows: list[Row] = []
    recovery: dict[str, float] = {}
    yield rows, recovery
    if not rows:
        return
    text = "\n".join(
        [
            "Recovery (fault end → every service ready): "
            + ", ".join(f"{f} {s:.1f} s" for f, s in recovery.items()),
            "",
            render_table(rows),
        ]
    )
    if system.lab_skip:
        text += f"\nFabric apply not run: {system.lab_skip}\n"
    write_table_section(TABLE, "shared", text)
    print("\n" + text)


def _all_ready(up: KariosUp) -> bool:
    return all(http_get(f"{up.url(s)}/readyz", timeout=2)[0] == 200 for s in SERVICES)


def _new_pid(up: KariosUp, service: str, old: int) -> bool:
    try:
        return up.service_pid(service) != old
    except LookupError:
        return False


def _inject(s: System, fault: str) -> float:
    """Apply ``fault`` and lift it; seconds from its end until every service is ready again."""
    if fault.startswith("SIGKILL "):
        service = fault.removeprefix("SIGKILL ")
        victim = s.up.service_pid(service)
        os.kill(victim, signal.SIGKILL)
        wait_until_sync(lambda: _new_pid(s.up, service, victim), timeout=60, what=f"{service} restarted")
    elif fault.startswith("NATS"):
        s.nats.stop()
        time.sleep(NATS_OUTAGE_S)  # holding the fault for its length, not waiting for a condition
        s.nats.start()
    else:
        s.pg.pause()
        try:
            time.sleep(PG_PAUSE_S)  # holding the fault for its length, not waiting for a condition
        finally:
            s.pg.resume()
    t_end = time.monotonic()
    wait_until_sync(lambda: _all_ready(s.up), timeout=120, interval=0.3, what=f"all ready after {fault}")
    return time.monotonic() - t_end


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", FAULTS)
def test_nothing_is_lost_or_duplicated_under(fault: str, system: System, table) -> None:
    rows, recovery = table
    s = system
    k = FAULTS.index(fault)
    s.db.execute(FORGET_INSTALLED_HOSTS)
    prov = Provisions(
        s.api, s.db, s.emu, s.bmcs, s.up.state / "provisioner" / "media", Row(fault, "5 provisions")
    )
    reg = Registrations(s.api, s.db, Row(fault, "200 registrations"), prefix=f"10.{150 + k}")
    fab = FabricApply(s.api, s.db, Row(fault, "fabric apply, 3 nodes")) if s.lab is not None else None
    prov.start()
    if fab is not None:
        fab.start()
    reg.start()
    # The fault strikes while every workload is in flight: provisions and the apply accepted
    # (their jobs working), registrations under way.
    wait_until_sync(
        lambda: prov.all_posted() and (fab is None or fab.posted.is_set()) and reg.answered() >= 30,
        timeout=120,
        interval=0.05,
        what="every workload in flight",
    )
    recovery[fault] = _inject(s, fault)
    done = [prov.finish(), reg.finish(), *([fab.finish()] if fab is not None else [])]
    for row in done:
        row.recovery_s = recovery[fault]
    rows.extend(done)
    assert s.up.proc.poll() is None, "karios up stopped:\n" + s.up.text()[-3000:]
    for row in done:
        assert row.lost == 0 and row.duplicated == 0, (row, row.notes)
        assert row.failed_without_reason == 0, (row, row.notes)
        assert row.accepted == row.completed + row.failed_with_reason, (row, row.notes)
        # The polite client gets every request in once the fault is over.
        assert row.accepted == row.submitted, (row, row.notes)
