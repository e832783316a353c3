"""Power of ``karios demo --vm`` servers: runs INSIDE the sushy-emulator process.

The emulator runs from its own venv, so this module imports nothing but the standard library (the
demo copies it beside the emulator's launcher). :func:`patch_fake_driver` wraps the fake driver's
power calls: for a system named in the spec file (``{uuid: {"argv": [...], "cd": [...],
"boot_cd": [...], "log": path}}``, written by :mod:`karios.cli.demo.vm`), a power-on starts qemu
(with the medium InsertMedia downloaded as its CD, booted once when the boot override says Cd), a
power-off kills it and a restart does both; the power state it reports is whether qemu runs. Every
other system keeps the fake driver's behaviour.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Redfish ResetType → (stop qemu first, start it). Anything else goes to the fake driver.
POWER_ACTIONS: dict[str, tuple[bool, bool]] = {
    "On": (False, True),
    "ForceOn": (False, True),
    "ForceOff": (True, False),
    "GracefulShutdown": (True, False),  # no guest agent to ask: the plug is pulled, as ForceOff
    "ForceRestart": (True, True),
    "GracefulRestart": (True, True),
    "PowerCycle": (True, True),
}


def qemu_command(spec: dict[str, Any], iso: str | None, boot_cd: bool) -> list[str]:
    """The qemu command of one system: its base command, the CD when a medium is inserted, booted
    once from it when the boot override is Cd (pure)."""
    argv = [str(a) for a in spec["argv"]]
    if iso:
        quoted = iso.replace(",", ",,")  # qemu's option syntax: a comma in a path is doubled
        argv += [str(a).replace("{iso}", quoted) for a in spec["cd"]]
        if boot_cd:
            argv += [str(a) for a in spec["boot_cd"]]
    return argv


def inserted_medium(system: dict[str, Any]) -> str | None:
    """The local file of the medium in the system's virtual CD (the fake driver's ``boot_image``
    entry: path, write protected, inserted), if one is inserted and still there."""
    entry = (system.get("boot_image") or {}).get("Cd")
    if not entry:
        return None
    path, _protected, inserted = entry
    return str(path) if inserted and path and os.path.exists(path) else None


def _die_with_parent() -> None:
    """Child side of Popen: SIGTERM when the emulator dies, however it dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Spawner:
    """Starts processes from one long-lived thread: PR_SET_PDEATHSIG fires when the *thread*
    that forked ends, and the emulator answers each request on a thread of its own."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[list[str], str, list[Any], threading.Event]] = queue.Queue()
        threading.Thread(target=self._run, name="karios-qemu-spawner", daemon=True).start()

    def _run(self) -> None:
        while True:
            argv, log, box, done = self._jobs.get()
            try:
                with open(log, "ab") as out:
                    box.append(
                        subprocess.Popen(
                            argv,
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            preexec_fn=_die_with_parent,  # from the spawner thread, which never ends
                        )
                    )
            except OSError as exc:
                box.append(exc)
            done.set()

    def popen(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        box: list[Any] = []
        done = threading.Event()
        self._jobs.put((argv, log, box, done))
        done.wait(30)
        if not box or isinstance(box[0], BaseException):
            raise OSError(f"cannot start {argv[0]}: {box[0] if box else 'timeout'}")
        return box[0]  # type: ignore[no-any-return]


class QemuPower:
    """The qemu process of every VM-backed system, by system UUID."""

    def __init__(self, spec_file: Path, spawn: Callable[[list[str], str], Any] | None = None) -> None:
        self.spec_file = Path(spec_file)
        self.procs: dict[str, Any] = {}
        self.commands: dict[str, list[str]] = {}  # the last command each system was started with
        self._lock = threading.Lock()
        self._spawn = spawn or _Spawner().popen

    def spec(self, uuid: str) -> dict[str, Any] | None:
        """The system's VM spec, or None for a plain fake system (read on every call: the demo
        writes the file once it knows the services' ports, after the emulator started)."""
        try:
            specs = json.loads(self.spec_file.read_text())
        except (OSError, ValueError):
            return None
        found = specs.get(uuid)
        return found if isinstance(found, dict) else None

    def running(self, uuid: str) -> bool:
        proc = self.procs.get(uuid)
        return proc is not None and proc.poll() is None

    def apply(self, uuid: str, spec: dict[str, Any], state: str, iso: str | None, boot_cd: bool) -> bool:
        """One Redfish reset of a VM-backed system; returns whether it is on afterwards."""
        stop, start = POWER_ACTIONS[state]
        with self._lock:
            if stop:
                self._stop(uuid)
            if start and not self.running(uuid):
                argv = qemu_command(spec, iso, boot_cd)
                self.commands[uuid] = argv
                self.procs[uuid] = self._spawn(argv, str(spec["log"]))
            return self.running(uuid)

    def _stop(self, uuid: str) -> None:
        proc = self.procs.pop(uuid, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def patch_fake_driver(driver_cls: Any, spec_file: str | Path, power: QemuPower | None = None) -> QemuPower:
    """Make the systems of ``spec_file`` real VMs: wraps ``set_power_state`` / ``get_power_state``
    of sushy-tools' ``FakeDriver`` (``driver_cls``); returns the :class:`QemuPower` behind them."""
    power = power or QemuPower(Path(spec_file))
    fake_set, fake_get = driver_cls.set_power_state, driver_cls.get_power_state

    def set_power_state(self: Any, identity: str, state: str) -> None:
        system = self._get(identity)
        spec = power.spec(system["uuid"])
        if spec is None or state not in POWER_ACTIONS:
            return fake_set(self, identity, state)  # type: ignore[no-any-return]
        on = power.apply(
            system["uuid"], spec, state, inserted_medium(system), boot_cd=system.get("boot_device") == "Cd"
        )
        # At once, unlike the fake driver's delayed change: qemu has started (or stopped) by now.
        self._update(system, power_state="On" if on else "Off", pending_power=None)
        return None

    def get_power_state(self: Any, identity: str) -> str:
        system = self._get(identity)
        uuid = system["uuid"]
        if system.get("power_state") == "On" and power.spec(uuid) is not None and not power.running(uuid):
            self._update(system, power_state="Off")  # the guest powered itself off
        return fake_get(self, identity)  # type: ignore[no-any-return]

    driver_cls.set_power_state = set_power_state
    driver_cls.get_power_state = get_power_state
    return power
