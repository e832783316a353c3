"""The preseed path up to its real stopping point, booted for real in qemu (TCG), no job service.

The Debian installer boots from the ISO Karios writes for the ``preseed`` method, configures the
network without asking (qemu's DHCP gives no name server and no route), and its reporter sends
``network`` with the job token. Without a reachable mirror it stops at "Bad archive mirror" and
the reporter sends ``failed`` with the installer's own words and its log tail within a minute of
the installer's failure (its syslog is captured on a second serial port to time that). The path
through the lab's apt proxy — ``mirror`` reached, then "Download installer components" fails
because the registry these machines reach lacks most bookworm udebs — is booted once, end to end
through the gateway: ``test_preseed_gateway.py``.

Times are measured from qemu start and printed (``-s`` shows them).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from karios.provisioner.media import MediaBuilder
from tests.fixtures.preseed_vm import (
    CALLBACK_IP,
    PROXY_IP,
    PROXY_PORT,
    TOKEN,
    CallbackRecorder,
    InstallerVM,
    build_preseed_iso,
    host_context,
    netboot_missing,
)
from tests.fixtures.wait import wait_until
from tests.lab.vm import Disk, qemu_missing

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200), pytest.mark.vm(chain="debian-installer")]

# TCG on a loaded 2-core machine: the installer reaches its mirror ~2 min after qemu starts.
BOOT_TO_FAILURE = 900.0


@pytest.fixture
def recorder():
    rec = CallbackRecorder()
    yield rec
    rec.close()


def _skip_unless_ready() -> None:
    missing = qemu_missing() + netboot_missing() + MediaBuilder(Path("/"), Path("/")).tools_missing()
    if missing:
        pytest.skip(f"booting the installer needs {', '.join(missing)} (tests/lab/setup.sh installs them)")


async def _boot(tmp_path: Path, rec: CallbackRecorder, *, proxy: bool) -> InstallerVM:
    ctx = host_context("job-preseed-vm", rec.port)
    iso = build_preseed_iso(tmp_path, ctx)
    fwd = {f"{CALLBACK_IP}:{rec.port}": rec.port}
    if proxy:
        fwd[f"{PROXY_IP}:{PROXY_PORT}"] = PROXY_PORT
    disks = [Disk(tmp_path / "vda.img", 4 << 30)]
    vm = InstallerVM(tmp_path, iso=iso, disks=disks, guestfwd=fwd, no_reboot=True)
    vm.start()
    rec.t0 = time.monotonic()
    return vm


def _timeline(rec: CallbackRecorder) -> str:
    return ", ".join(f"{c.body.get('step')}/{c.body.get('state')} {c.t:.0f}s" for c in rec.steps())


async def _failure(vm: InstallerVM, rec: CallbackRecorder, marker: str):
    """The failed callback, and when (since qemu start) ``marker`` first showed in the installer's
    syslog (ttyS1, followed every 0.5 s): the moment the installer failed."""
    seen: list[float] = []

    def failed():
        if not seen and marker in vm.syslog():
            seen.append(time.monotonic() - rec.t0)
        got = rec.failure()  # first: a failed install powers itself off once this is sent
        if got is None and vm.proc and vm.proc.poll() is not None:
            raise AssertionError(f"qemu exited before a failure was reported:\n{vm.syslog_tail()}")
        return got

    try:
        fail = await wait_until(failed, timeout=BOOT_TO_FAILURE, interval=0.5, what="a failed callback")
    except AssertionError as exc:
        detail = f"callbacks: {_timeline(rec)}\nsyslog tail:\n{vm.syslog_tail()}"
        raise AssertionError(f"{exc}\n{detail}") from None
    if not seen:  # the syslog (a file) is still read after the installer powered off

        def marked() -> bool:
            if marker in vm.syslog():
                seen.append(time.monotonic() - rec.t0)
            return bool(seen)

        await wait_until(marked, timeout=30, interval=0.5, what=f"{marker!r} in the installer syslog")
    return fail, seen[0]


def _assert_failure_payload(fail, rec: CallbackRecorder) -> None:
    body = fail.body
    assert fail.token == TOKEN and fail.path == "/controlnode/job/job-preseed-vm/step"
    assert isinstance(body.get("log"), list) and 5 <= len(body["log"]) <= 30, body
    assert all(isinstance(x, str) and len(x) <= 300 for x in body["log"])
    assert not any(" debconf: " in x for x in body["log"]), "the log tail is the installer's, not debconf's"
    assert "$6$" not in json.dumps(body), "no password hash in what the reporter sends"
    assert all(c.token == TOKEN for c in rec.calls), "every callback carries the job token"


async def test_without_a_reachable_mirror_the_installer_reports_a_bad_mirror(tmp_path, recorder):
    _skip_unless_ready()
    vm = await _boot(tmp_path, recorder, proxy=False)
    try:
        fail, failed_at = await _failure(vm, recorder, "INPUT critical mirror/bad")
    finally:
        vm.stop()
    steps = [(c.body["step"], c.body["state"]) for c in recorder.steps()]
    assert steps == [("network", "done"), ("mirror", "failed")], _timeline(recorder)
    assert recorder.step("network").body["percent"] == 52
    msg = fail.body["message"]
    assert "mirror" in msg.lower() and "mirror/bad" in msg, msg
    _assert_failure_payload(fail, recorder)
    assert fail.t - failed_at < 60, f"reported {fail.t - failed_at:.0f} s after the installer failed"
    print(f"\npreseed without proxy: {_timeline(recorder)}; failed at {failed_at:.0f}s; message: {msg[:160]}")
