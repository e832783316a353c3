"""Issue 24 (D6): the embedded NATS and PostgreSQL of ``karios up`` are supervised like the
services, and a state directory too small for the JetStream streams is an error at once; (S5) the
embedded NATS admits only the state directory's login.

- The login: ``<state>/nats-credentials.json`` is 0600; a nats-py connect without it is refused
  ("Authorization Violation"), one with it works (the event stream is there); every service is
  ready (so each logged in); the password is in no command line (`ps`), not in `karios up`'s
  console, not in any log under ``<state>/logs`` or of the nats-server, and the config file that
  holds it is 0600.
- SIGKILL of the embedded nats-server: ``karios up`` reaps it (no zombie), says "nats exited …
  restarting" and "nats restarted", starts it on the same port and store; the gateway's /readyz is
  200 again and a registration through the gateway (a bus request to inventory, then its database
  write) succeeds.
- SIGKILL of the embedded postmaster: the same ("postgresql restarted"), on the same data
  directory and socket; a token created through the gateway (a database write) and a
  registration succeed.
- A state directory on a 128 MiB tmpfs (root only): ``karios up`` exits 1 within seconds, the
  message naming KARIOS_BUS_EVENTS_MAX_BYTES, instead of services never getting ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import time
from collections.abc import Iterator

import nats
import nats.errors
import psutil
import pytest

from tests.fixtures.chaos import PORT_VARS, KariosUp, http_get, http_post, small_tmpfs, state_dir
from tests.fixtures.wait import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def up() -> Iterator[KariosUp]:
    with state_dir("karios-e2e-") as root:
        karios = KariosUp(root / "state")
        try:
            karios.wait_started()
            yield karios
        finally:
            karios.stop()


def _nats_server(up: KariosUp) -> psutil.Process | None:
    for p in psutil.Process(up.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and "nats-server" in p.cmdline()[0]:
                return p
    return None


def _postmaster_pid(up: KariosUp) -> int:
    """The pid in postmaster.pid; 0 while there is none (removed as stale, not yet written)."""
    try:
        return int((up.state / "postgres" / "postmaster.pid").read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return 0


def _reaped(pid: int) -> bool:
    """No zombie left for ``karios up`` to wait for (the pid is gone, or already someone else's)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _register(up: KariosUp, ip: str) -> bool:
    status, body, _ = http_post(
        f"{up.url()}/controlnode/register",
        {"bmc_ip": ip, "os_hostname": "emb-" + ip.replace(".", "-"), "bmc_password": "pw-emb"},
        up.token,
    )
    return status == 200 and json.loads(body)["success"] is True


def _recovered(up: KariosUp, ip: str) -> None:
    """/readyz 200 again and a write through the gateway succeeds (each waited for)."""
    wait_until_sync(
        lambda: http_get(f"{up.url()}/readyz", timeout=2)[0] == 200, timeout=60, what="gateway /readyz 200"
    )
    wait_until_sync(lambda: _register(up, ip), timeout=60, interval=0.5, what=f"register {ip} via gateway")


@pytest.mark.timeout(120)
def test_the_embedded_nats_admits_only_the_state_dirs_login_and_the_secret_is_never_shown(up: KariosUp):
    creds = up.state / "nats-credentials.json"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    login = up.nats_login()
    url = up.nats_url()
    assert "@" not in url and login["password"] not in url
    # The ready line says where the login is (never the password itself).
    assert f"(user {login['user']}, password in {creds})" in up.text()

    async def connects(**kw: str) -> str:
        try:
            nc = await nats.connect(
                url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3, **kw
            )
        except nats.errors.Error as exc:
            return str(exc)
        try:
            info = await nc.jetstream().stream_info("KARIOS_EVT")  # what a reader of events would take
            return f"ok {info.config.name}"
        finally:
            await nc.close()

    assert "Authorization Violation" in asyncio.run(connects())
    assert "Authorization Violation" in asyncio.run(connects(user=login["user"], password="guessed"))
    assert asyncio.run(connects(**login)) == "ok KARIOS_EVT"
    for service in PORT_VARS:  # every service logged in: its /readyz checks the bus
        assert http_get(f"{up.url(service)}/readyz", timeout=5)[0] == 200, service

    nats_proc = _nats_server(up)
    assert nats_proc is not None
    conf = up.state / "nats" / "nats-server.conf"
    argv = nats_proc.cmdline()
    assert _arg(argv, "-c") == str(conf) and stat.S_IMODE(conf.stat().st_mode) == 0o600
    secret = login["password"]
    cmdlines = [" ".join(p.cmdline()) for p in psutil.Process(up.proc.pid).children(recursive=True)]
    assert cmdlines and not [c for c in cmdlines if secret in c]
    assert secret not in up.text()
    assert _logs_holding(up, secret) == []


def _logs_holding(up: KariosUp, secret: str) -> list[str]:
    """The logs of the run that contain ``secret``: every one under <state>/logs (one per service,
    karios.log once it says something), the nats-server's and PostgreSQL's."""
    logs = [
        *(up.state / "logs").rglob("*.log"),
        up.state / "nats" / "nats-server.log",
        up.state / "postgres" / "log",
    ]
    assert len(logs) >= len(PORT_VARS) + 2, logs
    return [str(p) for p in logs if secret in p.read_text(errors="replace")]


@pytest.mark.timeout(300)
def test_a_sigkilled_embedded_nats_is_restarted_on_its_port_and_the_system_recovers(up: KariosUp):
    old = _nats_server(up)
    assert old is not None
    argv, services = old.cmdline(), up.pids()
    assert _register(up, "10.24.6.1")

    old.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    wait_until_sync(lambda: "nats restarted (pid" in up.text(), timeout=20, what="nats restarted")
    new = _nats_server(up)
    assert new is not None and new.pid != old.pid
    # The same client port (the services' URL) and store; the first start let the server pick it.
    port = up.nats_url().rsplit(":", 1)[1]
    now = new.cmdline()
    assert _arg(now, "-p") == port and _arg(now, "-sd") == _arg(argv, "-sd"), now
    assert _arg(now, "-c") == _arg(argv, "-c")  # and the same login (the config written again)
    assert _reaped(old.pid), "the killed nats-server is left a zombie"
    _recovered(up, "10.24.6.2")
    took = time.monotonic() - t0
    wait_until_sync(lambda: "nats ready again after" in up.text(), timeout=10, what="nats ready again")
    assert "nats exited with code -9; restarting in" in up.text()
    assert "nats restarted" in (up.state / "logs" / "karios.log").read_text()
    assert up.pids() == services  # the services reconnected by themselves: none was restarted
    assert up.proc.poll() is None
    print(f"nats-server SIGKILL → gateway write OK in {took:.1f} s")


@pytest.mark.timeout(300)
def test_a_sigkilled_embedded_postgres_is_restarted_on_its_data_dir_and_the_system_recovers(up: KariosUp):
    _recovered(up, "10.24.6.3")  # (after the test above, or alone)
    old, services = _postmaster_pid(up), up.pids()

    os.kill(old, signal.SIGKILL)
    t0 = time.monotonic()
    wait_until_sync(lambda: "postgresql restarted (pid" in up.text(), timeout=30, what="postgresql restarted")
    assert "postgresql exited with code -9; restarting in" in up.text()
    new = wait_until_sync(
        lambda: (pid := _postmaster_pid(up)) not in (0, old) and psutil.pid_exists(pid) and pid,
        timeout=30,
        what="a new postmaster",
    )
    assert psutil.Process(new).ppid() == up.proc.pid  # supervised: a child of karios up again
    assert _reaped(old), "the killed postmaster is left a zombie"
    _recovered(up, "10.24.6.4")
    status, body, _ = http_post(
        f"{up.url()}/controlnode/tokens", {"name": "after-pg-kill", "role": "viewer"}, up.token
    )
    assert status == 201, body
    took = time.monotonic() - t0
    wait_until_sync(
        lambda: "postgresql ready again after" in up.text(), timeout=10, what="postgresql ready again"
    )
    # Same data directory and socket: the services' database URL still works, none was restarted.
    assert up.pids() == services
    assert "postgresql restarted" in (up.state / "logs" / "karios.log").read_text()
    assert up.proc.poll() is None
    print(f"postmaster SIGKILL → gateway writes OK in {took:.1f} s")


def test_after_the_restarts_the_nats_password_is_still_in_no_log_or_console(up: KariosUp):
    # The services reconnected to a restarted nats-server (and the database) and said so.
    secret = up.nats_login()["password"]
    assert secret not in up.text() and _logs_holding(up, secret) == []


@pytest.mark.timeout(60)
def test_a_state_dir_too_small_for_the_event_stream_fails_at_once_naming_the_setting():
    with small_tmpfs("128m") as mnt:
        t0 = time.monotonic()
        karios = KariosUp(mnt / "state")
        try:
            code = karios.proc.wait(30)
        finally:
            karios.stop()
        took = time.monotonic() - t0
    text = karios.text()
    assert code == 1, text
    assert "not enough disk for the JetStream streams" in text, text
    assert "KARIOS_EVT reserves 1.0 GiB" in text and "Lower KARIOS_BUS_EVENTS_MAX_BYTES (e.g." in text, text
    assert "Traceback" not in text and "not ready in" not in text, text
    assert took < 15, f"took {took:.1f} s"
    print(f"too-small state dir → exit 1 in {took:.1f} s")
