"""`karios up` supervises its services: a SIGKILLed inventory comes back, nothing else stops."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.fixtures.chaos import KariosUp, http_get, state_dir
from tests.fixtures.wait import wait_until_sync

OTHERS = ("api-gateway", "bootapi", "provisioner", "fabric-worker")


@pytest.fixture
def karios() -> Iterator[KariosUp]:
    with state_dir("karios-e2e-") as root:
        up = KariosUp(root / "state")
        try:
            up.wait_started()
            yield up
        finally:
            up.stop()


def _register(up: KariosUp, bmc_ip: str) -> tuple[int, dict[str, object]]:
    body = json.dumps({"bmc_ip": bmc_ip, "os_hostname": "sup-1", "bmc_password": "pw-sup"}).encode()
    req = urllib.request.Request(
        f"{up.url()}/controlnode/register",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {up.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.timeout(300)
def test_sigkilled_inventory_is_restarted_and_the_rest_keeps_running(karios: KariosUp):
    others = {name: karios.service_pid(name) for name in OTHERS}
    victim = karios.service_pid("inventory")
    assert _register(karios, "10.9.1.1")[0] == 200

    os.kill(victim, signal.SIGKILL)
    t_kill = time.monotonic()
    wait_until_sync(
        lambda: "inventory exited with code -9; restarting" in karios.text(),
        timeout=20,
        what="the supervisor to announce the restart",
    )
    new_pid = wait_until_sync(lambda: _pid_if_new(karios, victim), timeout=30, what="a new inventory process")
    wait_until_sync(
        lambda: http_get(f"{karios.url('inventory')}/readyz", timeout=2)[0] == 200,
        timeout=60,
        what="inventory /readyz green again",
    )
    recovered = time.monotonic() - t_kill
    wait_until_sync(lambda: "inventory ready again" in karios.text(), timeout=10, what="ready-again line")

    # A gateway request that needs inventory succeeds again (a request/reply to it).
    _status, body = wait_until_sync(
        lambda: (r := _register(karios, "10.9.1.2"))[0] == 200 and r, timeout=30, what="register via gateway"
    )
    assert body["success"] is True
    # Nothing else was restarted, and `karios up` is still running.
    assert {name: karios.service_pid(name) for name in OTHERS} == others
    assert karios.proc.poll() is None and new_pid != victim
    log = (karios.state / "logs" / "inventory.log").read_text(errors="replace")
    assert "karios supervisor: inventory exited with code -9; restarting" in log
    assert "inventory restarted" in (karios.state / "logs" / "karios.log").read_text()
    print(f"inventory SIGKILL → ready again in {recovered:.1f} s")


def _pid_if_new(up: KariosUp, old: int) -> int | None:
    try:
        pid = up.service_pid("inventory")
    except LookupError:
        return None
    return pid if pid != old else None


@pytest.mark.timeout(300)
def test_a_crash_loop_gives_up_with_a_clear_message():
    with state_dir("karios-e2e-") as root:
        up = KariosUp(root / "state", "--max-crashes", "2", "--crash-window", "120")
        try:
            up.wait_started()
            for _ in range(2):
                pid = up.service_pid("fabric-worker")
                os.kill(pid, signal.SIGKILL)
                wait_until_sync(
                    lambda p=pid: up.proc.poll() is not None or _pid_changed(up, "fabric-worker", p),
                    timeout=30,
                    what="fabric-worker restarted or karios up stopped",
                )
            wait_until_sync(lambda: up.proc.poll() is not None, timeout=60, what="karios up to give up")
        finally:
            code = up.stop()
    assert code == 1
    text = up.text()
    assert "fabric-worker exited with code -9; restarting in" in text
    assert "fabric-worker crashed 2 times within 120 s" in text and "giving up" in text
    assert "karios: stopped" in text


def _pid_changed(up: KariosUp, service: str, old: int) -> bool:
    try:
        return up.service_pid(service) != old
    except LookupError:
        return False


@pytest.mark.timeout(300)
def test_a_service_killed_while_starting_is_restarted_and_the_system_comes_up():
    # Start-up is supervised too: a service that dies before it is ready (a port still held a
    # moment, a database still starting) is restarted, not a reason to stop everything.
    with state_dir("karios-e2e-") as root:
        up = KariosUp(root / "state")
        try:
            pid = wait_until_sync(lambda: _pid_or_none(up, "fabric-worker"), timeout=60, interval=0.02)
            os.kill(pid, signal.SIGKILL)
            up.wait_started()
            assert up.service_pid("fabric-worker") != pid
            assert http_get(f"http://127.0.0.1:{up.ports['fabric-worker']}/readyz")[0] == 200
        finally:
            up.stop()
    text = up.text()
    assert "fabric-worker exited with code -9; restarting in" in text
    assert "failed to start" not in text


def _pid_or_none(up: KariosUp, service: str) -> int | None:
    try:
        return up.service_pid(service)
    except LookupError:
        return None
