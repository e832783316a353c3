"""The chaos table, the faults that take the system itself down (issue 24 item 8): a full disk, a
taken port, a SIGKILLed ``karios up``.

One ``karios up`` as a user runs it — its own embedded NATS and PostgreSQL, the PostgreSQL data
directory on a small tmpfs (a symlink from the state directory) — and three BMCs on the sushy-tools
Redfish emulator. Each fault strikes while two workloads are in flight (those of
``test_chaos_table.py``, whose fixtures count them against the database and the emulator's log):
W1, one provision per BMC driven to ``completed`` by playing the installer, and W2, 200
registrations. The fabric apply (W3) is not run here: it needs the host-link lab, which the shared
system of ``test_chaos_table.py`` holds.

- **disk full**: the tmpfs under PostgreSQL filled to its last page for :data:`DISK_FULL_S`
  seconds (the method of ``test_disk_full.py``: a WAL switch and a checkpoint first, so the
  refused writes are the data files'), then freed. Writes answer 503 ``STORAGE_FULL`` meanwhile
  (never 500), and the system recovers without a restart.
- **port taken**: the gateway is SIGKILLed and a foreign HTTP server takes its port at once for
  until :data:`PORT_FAILED_STARTS` restarts of the gateway have failed to bind it, answering
  ``/readyz`` 200 (what fooled the supervisor before: S3) and 503 to the rest. ``karios up``
  restarts the gateway with backoff and never reports it ready while the foreign process answers
  (the per-start instance header); once the port is free the gateway is back.
- **SIGKILL karios up** (last: it takes the system down): every child — services, nats-server,
  the postmaster and its backends — dies with it (PR_SET_PDEATHSIG); a new ``karios up`` on the
  same state directory and ports starts clean and finds everything (every node registered
  before, the jobs in flight finish).

Lost and duplicated must be 0, no 500; the rows go to section ``restarts`` of the table file
(``$KARIOS_CHAOS_TABLE``, default ``/tmp/karios-chaos-table.md``; ``test_chaos_table.py`` writes
section ``shared``), whatever order the two modules run in.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from karios.common.instance import INSTANCE_HEADER
from tests.fixtures.chaos import DiskFull, KariosUp, http_get, small_tmpfs, state_dir
from tests.fixtures.chaos_jobs import Bmc, Provisions, system_env
from tests.fixtures.chaos_work import Api, Db, Registrations, Row, render_table, write_table_section
from tests.fixtures.provision import write_inventory
from tests.fixtures.wait import wait_until_sync
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.slow]
CI = os.environ.get("CI", "").lower() == "true"
SERVICES = ("api-gateway", "provisioner", "inventory", "fabric-worker", "bootapi")
FAULTS = ["disk full (PostgreSQL) 10 s", "gateway port taken", "SIGKILL karios up"]
TABLE = Path(os.environ.get("KARIOS_CHAOS_TABLE", "/tmp/karios-chaos-table.md"))
LOGS = TABLE.with_name(TABLE.stem + "-restarts-logs")
TMPFS_SIZE = "384m"  # initdb, every service's schema, WAL segments, and room to spare
DISK_FULL_S = 10.0
#: The port is held until a restarted gateway has failed to bind it this many times (each failure
#: is a crash; with the SIGKILL, under ``karios up``'s crash-loop limit of 5 within 60 s).
PORT_FAILED_STARTS = 2
BMC_IPS = [f"10.97.0.{i}" for i in range(1, 4)]


@dataclass
class System:
    up: KariosUp
    emu: RedfishEmulator
    api: Api
    bmcs: list[Bmc]
    disk: DiskFull
    env: dict[str, str]
    notes: dict[str, list[str]] = field(default_factory=dict)

    def db(self, database: str = "karios") -> Db:
        return Db(self.up.database_url(database))


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with state_dir("karios-chaos-restarts-") as root, contextlib.ExitStack() as stack:
        try:
            emu = RedfishEmulator([fake_system(f"node{i}") for i in range(1, 4)], auth=True).start()
        except Exception as exc:  # pragma: no cover - depends on the machine
            if CI:
                pytest.fail(f"sushy-tools emulator required in CI: {exc}", pytrace=False)
            pytest.skip(f"sushy-tools emulator unavailable: {exc}")
        stack.callback(emu.stop)
        disk_root = stack.enter_context(small_tmpfs(TMPFS_SIZE))
        disk = DiskFull(disk_root)
        state = root / "state"
        state.mkdir()
        (disk_root / "postgres").mkdir()
        (state / "postgres").symlink_to(disk_root / "postgres")
        inventory = write_inventory(root / "inventory.yaml", BMC_IPS)
        env = system_env(emu, BMC_IPS, inventory)
        up = KariosUp(state, env=env)
        s = System(
            up,
            emu,
            Api(up.url(), ""),
            [Bmc(ip, sid) for ip, sid in zip(BMC_IPS, emu.system_ids, strict=True)],
            disk,
            env,
        )
        stack.callback(lambda: s.up.stop())  # the karios up of the moment (the last row starts another)
        stack.callback(disk.free)  # before PostgreSQL stops (it writes as it stops)
        stack.callback(_keep_logs, s)
        up.wait_started()
        s.api.token = up.token
        yield s


def _keep_logs(s: System) -> None:
    """The services' logs and both consoles outlive the state directory."""
    shutil.rmtree(LOGS, ignore_errors=True)
    with contextlib.suppress(OSError):
        shutil.copytree(s.up.state / "logs", LOGS, dirs_exist_ok=True)
        (LOGS / "karios-up.console").write_text(s.up.text())


@pytest.fixture(scope="module")
def table(system: System) -> Iterator[list[Row]]:
    rows: list[Row] = []
    yield rows
    if not rows:
        return
    lines = [f"- {fault}: {'; '.join(n)}" for fault, n in system.notes.items() if n]
    text = "\n".join(
        [
            "Faults that take the system down (own `karios up`, no fabric apply):",
            *lines,
            "",
            render_table(rows),
        ]
    )
    write_table_section(TABLE, "restarts", text)
    print("\n" + text)


def _all_ready(up: KariosUp) -> bool:
    """Every service answers /readyz 200, each from a process ``karios up`` started (it carries
    the instance header; a foreign process does not)."""
    for name in SERVICES:
        status, _, headers = http_get(f"{up.url(name)}/readyz", timeout=2)
        if status != 200 or not headers.get(INSTANCE_HEADER.lower()):
            return False
    return True


def _wait_all_ready(up: KariosUp, fault: str, timeout: float = 180) -> None:
    wait_until_sync(lambda: _all_ready(up), timeout=timeout, interval=0.3, what=f"all ready after {fault}")


class ForeignServer:
    """Another program's web server on a port: ``/readyz`` 200 (as a service would), 503 elsewhere."""

    def __init__(self, port: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                ready = self.path.startswith("/readyz")
                body = json.dumps({"status": "ok"} if ready else {"detail": "maintenance"}).encode()
                self.send_response(200 if ready else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if not ready:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _take_port(port: int, timeout: float = 5.0) -> ForeignServer:
    """The port, taken the moment it is free (the killed gateway's socket closes with it)."""
    t_end = time.monotonic() + timeout
    while True:
        try:
            return ForeignServer(port)
        except OSError:
            if time.monotonic() > t_end:
                raise
            time.sleep(0.01)  # racing the supervisor's restart for the port


def _tree(up: KariosUp) -> list[psutil.Process]:
    """``karios up`` and every process under it, the postmaster's backends included."""
    root = psutil.Process(up.proc.pid)
    return [root, *root.children(recursive=True)]


def _left(tree: list[psutil.Process]) -> list[str]:
    out = []
    for p in tree:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid}: {' '.join(p.cmdline()) or p.name()}")
    return out


def _registered(db: Db) -> set[str]:
    return {r["bmc_ip"] for r in db.rows("SELECT bmc_ip FROM inventory.bmc_infos")}


def _inject(s: System, fault: str, workloads: tuple[Provisions, Registrations]) -> float:
    """Apply ``fault`` and lift it; seconds from its end until every service is ready again."""
    notes = s.notes.setdefault(fault, [])
    t_end: float | None = None  # the fault's end (default: when it is lifted, below)
    if fault.startswith("disk full"):
        admin = s.db("postgres")
        admin.execute("SELECT pg_switch_wal()")  # a fresh WAL segment: refused writes hit data files
        admin.execute("CHECKPOINT")
        filled = s.disk.fill()
        notes.append(f"{filled >> 20} MiB written to fill the disk")
        time.sleep(DISK_FULL_S)  # holding the fault for its length, not waiting for a condition
        s.disk.free()
    elif fault.startswith("gateway port taken"):
        port = s.up.ports["api-gateway"]
        victim = s.up.service_pid("api-gateway")
        os.kill(victim, signal.SIGKILL)
        foreign = _take_port(port)
        t_taken, at = time.monotonic(), len(s.up.lines)

        def failed_starts() -> int:  # restarts that exited (not the SIGKILL), as karios up says
            return len(re.findall(r"api-gateway exited with code (?!-9)", "".join(s.up.lines[at:])))

        try:
            wait_until_sync(
                lambda: failed_starts() >= PORT_FAILED_STARTS,
                timeout=120,
                interval=0.2,
                what=f"{PORT_FAILED_STARTS} restarts of the gateway to fail on the taken port",
            )
        finally:
            foreign.close()
        held = time.monotonic() - t_taken
        during = "".join(s.up.lines[at:])
        assert "api-gateway ready again" not in during, during  # the foreign /readyz fooled no one
        log = (s.up.state / "logs" / "api-gateway.log").read_text(errors="replace")
        assert "address already in use" in log.lower(), log[-2000:]  # the child said why, loudly
        notes.append(
            f"port held {held:.1f} s: {failed_starts()} gateway restarts failed to bind it (said in "
            "its log), none reported ready; the 5xx seen are the foreign server's 503s"
        )
    else:
        before = _registered(s.db())
        tree = _tree(s.up)
        names = " ".join(" ".join(p.cmdline()) for p in tree if p.is_running())
        assert "nats-server" in names and "postgres" in names, names
        t_end = t_kill = time.monotonic()  # recovery: from the kill (a user starts it again at once)
        s.up.proc.kill()
        s.up.proc.wait(10)
        wait_until_sync(lambda: not _left(tree), timeout=30, what="every child of karios up to exit")
        gone = time.monotonic() - t_kill
        old = s.up
        s.up = KariosUp(old.state, env=s.env, ports=old.ports)
        started = s.up.wait_started()
        db = s.db()
        for w in workloads:
            w.db = db  # the new postmaster's socket
        missing = before - _registered(db)
        assert not missing, f"registered before the kill, gone after: {sorted(missing)[:5]}"
        notes.append(
            f"every child gone {gone:.1f} s after the SIGKILL; the next karios up ready in {started:.1f} s "
            f"and found all {len(before)} nodes registered before"
        )
    t_end = time.monotonic() if t_end is None else t_end
    _wait_all_ready(s.up, fault)
    return time.monotonic() - t_end


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", FAULTS)  # in this order: the last takes the system down
def test_nothing_is_lost_or_duplicated_under(fault: str, system: System, table: list[Row]) -> None:
    s = system
    k = FAULTS.index(fault)
    db = s.db()
    prov = Provisions(
        s.api,
        db,
        s.emu,
        s.bmcs,
        s.up.state / "provisioner" / "media",
        Row(fault, f"{len(s.bmcs)} provisions"),
    )
    reg = Registrations(s.api, db, Row(fault, "200 registrations"), prefix=f"10.{170 + k}")
    prov.start()
    reg.start()
    wait_until_sync(
        lambda: prov.all_posted() and reg.answered() >= 30,
        timeout=120,
        interval=0.05,
        what="every workload in flight",
    )
    recovery = _inject(s, fault, (prov, reg))
    done = [prov.finish(), reg.finish()]
    for row in done:
        row.recovery_s = recovery
    table.extend(done)
    assert s.up.proc.poll() is None, "karios up stopped:\n" + s.up.text()[-3000:]
    for row in done:
        assert row.lost == 0 and row.duplicated == 0, (row, row.notes)
        assert row.failed_without_reason == 0, (row, row.notes)
        assert row.internal_errors == 0, (row, row.notes)  # 503 with a code, never a 500
        assert row.accepted == row.completed + row.failed_with_reason, (row, row.notes)
        assert row.accepted == row.submitted, (row, row.notes)
