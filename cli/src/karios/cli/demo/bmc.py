"""Emulated BMCs for ``karios demo``: OpenStack's ``sushy-emulator`` (PyPI sushy-tools) with its
fake driver, one process serving every demo server on 127.0.0.1.

sushy-tools is not a dependency of Karios (it pins Flask and friends): it runs from its own venv,
built once under the user's cache (``$XDG_CACHE_HOME/karios/sushy-venv``) with ``uv`` (or
``python -m venv`` + pip) unless ``sushy-emulator`` is on PATH or given explicitly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path

from karios.cli.demo import vm_power
from karios.cli.embedded import die_with_parent

SUSHY_TOOLS_VERSION = "2.2.0"  # the power-delay patch below is checked against this source

# sushy-tools' fake driver waits randint(1, 11) s before a power change applies and has no setting
# for it; a demo should not wait: the delay becomes 0 (the next GET applies the change).
_LAUNCHER = """\
import sys
from sushy_tools.emulator.resources.systems import fakedriver

class _NoPowerDelay:
    @staticmethod
    def randint(a, b):
        return 0

if hasattr(fakedriver, "random"):
    fakedriver.random = _NoPowerDelay()
{vm_power}from sushy_tools.emulator.main import main
sys.argv[0] = "sushy-emulator"
sys.exit(main())
"""
# `karios demo --vm`: the systems of the spec file are qemu VMs (karios.cli.demo.vm_power, copied
# beside the launcher: the emulator's venv has no Karios).
_VM_POWER = """\
sys.path.insert(0, {workdir!r})
import karios_vm_power
karios_vm_power.patch_fake_driver(fakedriver.FakeDriver, {spec!r})
"""


def launcher(workdir: Path, vm_spec: Path | None = None) -> str:
    """The emulator's launcher script: the fake driver without its power delay, and with
    ``vm_spec`` its systems named there booted as VMs."""
    vm = _VM_POWER.format(workdir=str(workdir), spec=str(vm_spec)) if vm_spec else ""
    return _LAUNCHER.format(vm_power=vm)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "karios"


def find_emulator(explicit: str | None = None, *, install: bool = True) -> str:
    """A ``sushy-emulator`` executable: the explicit one, PATH, the cached venv, else build it."""
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise FileNotFoundError(f"sushy-emulator not executable: {explicit}")
        return explicit
    venv = cache_dir() / "sushy-venv"
    exe, marker = venv / "bin" / "sushy-emulator", venv / ".karios-complete"
    found = shutil.which("sushy-emulator")
    if found:
        return found
    if marker.exists() and os.access(exe, os.X_OK):
        return str(exe)
    if not install:
        raise FileNotFoundError("sushy-emulator not found (pip install sushy-tools)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "sushy-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two demos at once: one builds, the other waits
        if not marker.exists():
            _build_venv(venv)
            marker.write_text(f"sushy-tools=={SUSHY_TOOLS_VERSION}\n")
    return str(exe)


def _build_venv(venv: Path) -> None:
    print(f"karios demo: installing sushy-tools {SUSHY_TOOLS_VERSION} into {venv} (once)…", flush=True)
    shutil.rmtree(venv, ignore_errors=True)  # an interrupted build
    pkgs = [f"sushy-tools=={SUSHY_TOOLS_VERSION}", "bcrypt"]
    uv = shutil.which("uv")
    if uv:
        steps = [
            [uv, "venv", "-q", "--seed", str(venv)],
            [uv, "pip", "install", "-q", "-p", str(venv), *pkgs],
        ]
    else:
        pip = str(venv / "bin" / "pip")
        steps = [[sys.executable, "-m", "venv", str(venv)], [pip, "install", "-q", *pkgs]]
    for argv in steps:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if res.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise RuntimeError(
                f"installing sushy-tools failed ({' '.join(argv[:3])}…):\n{res.stderr[-2000:]}"
            )


def _python_of(exe: str) -> str | None:
    """The interpreter of a pip-generated ``sushy-emulator`` script (its shebang)."""
    with contextlib.suppress(OSError, UnicodeDecodeError), open(exe, "rb") as fh:
        first = fh.readline().decode().strip()
        if first.startswith("#!") and os.path.basename(first[2:].split()[0]).startswith("python"):
            return first[2:].split()[0]
    return None


def _htpasswd_line(python: str, user: str, password: str) -> str | None:
    """``user:$2b$…`` for the emulator's auth file (bcrypt is the digest it accepts), if bcrypt is there."""
    code = "import bcrypt,sys;print(bcrypt.hashpw(sys.stdin.read().encode(), bcrypt.gensalt(5)).decode())"
    res = subprocess.run([python, "-c", code], input=password, capture_output=True, text=True, check=False)
    return f"{user}:{res.stdout.strip()}" if res.returncode == 0 else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DemoBmcs:
    """One sushy-emulator with ``count`` fake servers (powered off, one NIC each)."""

    workdir: Path
    count: int = 3
    executable: str | None = None
    username: str = "admin"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    port: int = 0
    auth: bool = False
    systems: list[dict[str, object]] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    #: ``karios demo --vm``: the VM spec file (karios.cli.demo.vm.qemu_spec per system UUID),
    #: read by the emulator at each power action (written once the services' ports are known).
    vm_spec: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "emulator.log"

    def start(self, timeout: float = 30.0) -> DemoBmcs:
        exe = find_emulator(self.executable)
        python = _python_of(exe)
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "state").mkdir(exist_ok=True)
        self.systems = [
            {
                "uuid": str(uuidlib.uuid4()),
                "name": f"demo-{i}",
                "power_state": "Off",
                "external_notifier": False,
                "nics": [{"mac": "52:54:00:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(3))}],
            }
            for i in range(1, self.count + 1)
        ]
        self.port = self.port or _free_port()
        config: dict[str, object] = {
            "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
            "SUSHY_EMULATOR_LISTEN_PORT": self.port,
            "SUSHY_EMULATOR_FAKE_DRIVER": True,
            "SUSHY_EMULATOR_FAKE_SYSTEMS": self.systems,
            "SUSHY_EMULATOR_STATE_DIR": str(self.workdir / "state"),
        }
        line = _htpasswd_line(python, self.username, self.password) if python else None
        if line:
            (self.workdir / "htpasswd").write_text(line + "\n")
            config["SUSHY_EMULATOR_AUTH_FILE"] = str(self.workdir / "htpasswd")
        self.auth = bool(line)
        cfg = self.workdir / "emulator.conf"
        cfg.write_text("".join(f"{k} = {v!r}\n" for k, v in config.items()))
        argv = [exe]
        env = {k: v for k, v in os.environ.items() if k != "SUSHY_EMULATOR_CONFIG"}
        if self.vm_spec is not None:
            if not python:
                raise RuntimeError(f"{exe} is not a pip-installed script: --vm needs its interpreter")
            shutil.copyfile(Path(vm_power.__file__), self.workdir / "karios_vm_power.py")
            # InsertMedia downloads the medium into TMPDIR: the demo's directory, not /tmp.
            env["TMPDIR"] = str(self.workdir / "vmedia")
            (self.workdir / "vmedia").mkdir(exist_ok=True)
        if python:
            (self.workdir / "launch.py").write_text(launcher(self.workdir, self.vm_spec))
            argv = [python, str(self.workdir / "launch.py")]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*argv, "--config", str(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, "PYTHONUNBUFFERED": "1"},
                cwd=self.workdir,
                preexec_fn=die_with_parent,  # own process group; SIGTERM if the demo dies
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                break
            url = self.url + "/redfish/v1/"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310
                if r.status == 200:
                    return
            time.sleep(0.1)
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        self.stop()
        raise RuntimeError(f"sushy-emulator did not come up; its log ends:\n{tail}")

    def endpoints(self, bmc_ips: list[str]) -> str:
        """``KARIOS_PROVISIONER_BMC_ENDPOINTS``: each demo BMC address → its emulated system."""
        creds = {"username": self.username, "password": self.password}
        return json.dumps(
            {
                ip: {"url": self.url, "system_id": s["uuid"], **creds}
                for ip, s in zip(bmc_ips, self.systems, strict=True)
            }
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 15)  # its process group: the emulator and what it forked
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=5)
        self.proc = None
