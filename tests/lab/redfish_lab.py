"""Redfish BMC lab: OpenStack's `sushy-emulator` (PyPI sushy-tools) with its fake driver.

Stdlib only: imported from a pytest conftest. See README.md in this folder.

The emulator runs from its own cached venv (it pins Flask etc. that must not leak into
the project venv): ``${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/sushy-venv``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid as uuidlib

SUSHY_TOOLS_VERSION = "2.2.0"  # the zero-delay patch below is checked against this source


def cache_dir() -> str:
    return os.environ.get("KARIOS_LAB_CACHE") or "/var/cache/karios-lab"


def sushy_venv_dir() -> str:
    return os.path.join(cache_dir(), "sushy-venv")


def find_sushy_emulator(sushy_emulator: str | None = None, *, install: bool = True) -> str:
    """Path of a `sushy-emulator` executable.

    Order: the explicit path, `shutil.which`, the cached venv, else (install=True) build
    the cached venv with `python3 -m venv` + pip (~15 s once, then instant).
    """
    if sushy_emulator:
        if not os.access(sushy_emulator, os.X_OK):
            raise FileNotFoundError(f"sushy-emulator not executable: {sushy_emulator}")
        return sushy_emulator
    found = shutil.which("sushy-emulator")
    if found:
        return found
    cached = _cached_emulator()
    if cached:
        return cached
    if not install:
        raise FileNotFoundError("sushy-emulator not found (pip install sushy-tools)")
    return install_sushy_venv()


def _cached_emulator() -> str | None:
    exe = os.path.join(sushy_venv_dir(), "bin", "sushy-emulator")
    marker = os.path.join(sushy_venv_dir(), ".karios-complete")
    return exe if os.path.exists(marker) and os.access(exe, os.X_OK) else None


def install_sushy_venv() -> str:
    """Build the cached sushy-tools venv; a marker file tells a complete build."""
    venv = sushy_venv_dir()
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), "sushy-venv.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel pytest workers: one builds, others wait
        cached = _cached_emulator()
        if cached:
            return cached
        shutil.rmtree(venv, ignore_errors=True)  # an interrupted build
        try:
            python = sys.executable or shutil.which("python3") or "python3"
            subprocess.run([python, "-m", "venv", venv], check=True, capture_output=True)
            res = subprocess.run(
                [
                    os.path.join(venv, "bin", "pip"),
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    f"sushy-tools=={SUSHY_TOOLS_VERSION}",
                    "bcrypt",
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if res.returncode != 0:
                raise RuntimeError(f"pip install sushy-tools failed:\n{res.stdout}\n{res.stderr}")
            with open(os.path.join(venv, ".karios-complete"), "w") as fh:
                fh.write(f"sushy-tools=={SUSHY_TOOLS_VERSION}\n")
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
    return os.path.join(venv, "bin", "sushy-emulator")


def emulator_python(sushy_emulator: str) -> str | None:
    """The interpreter of a pip-generated `sushy-emulator` script (from its shebang)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(sushy_emulator, "rb") as fh:
            first = fh.readline().decode().strip()
        if first.startswith("#!"):
            parts = first[2:].split()
            if parts and os.path.basename(parts[0]).startswith("python"):
                return parts[0]
    return None


def bcrypt_htpasswd_line(username: str, password: str, python: str | None) -> str:
    """`user:$2b$...` for SUSHY_EMULATOR_AUTH_FILE (bcrypt is the only digest it accepts).

    Uses the `bcrypt` module of the emulator's interpreter, else `htpasswd -B`.
    """
    if python:
        res = subprocess.run(
            [
                python,
                "-c",
                "import bcrypt,sys;"
                "print(bcrypt.hashpw(sys.stdin.read().encode(), bcrypt.gensalt(rounds=5)).decode())",
            ],
            input=password,
            capture_output=True,
            text=True,
        )
        if res.returncode == 0:
            return f"{username}:{res.stdout.strip()}"
    if shutil.which("htpasswd"):
        res = subprocess.run(
            ["htpasswd", "-nbB", "-C", "5", username, password], capture_output=True, text=True, check=True
        )
        return res.stdout.strip()
    raise RuntimeError("no bcrypt: neither the emulator's python has it nor htpasswd exists")


# Replaces the fake driver's `random` so `randint(1, 11)` (the power-change delay) is 0:
# `set_power_state` then stamps apply_time = int(time.time()) and the next GET applies it.
# sushy-tools has no config option or env var for this delay (fakedriver.py, 2.2.0).
_NO_POWER_DELAY = """\
import sys
from sushy_tools.emulator.resources.systems import fakedriver

class _NoPowerDelay:
    @staticmethod
    def randint(a, b):
        return 0

if not hasattr(fakedriver, "random"):
    sys.exit("karios lab: sushy-tools fakedriver has no `random` to patch; "
             "run with instant_power=False")
fakedriver.random = _NoPowerDelay()
"""
# HTTPS: werkzeug wraps its listening socket, so every TLS handshake runs inside accept() on the
# serving thread, and one client that is slow to finish its handshake (e.g. a client in the same
# event loop as a test's blocking call) stalls every other connection. A real BMC handshakes
# connections concurrently: the handshake is moved to the request thread (first read).
_LAZY_TLS_HANDSHAKE = """\
import ssl

_wrap_socket = ssl.SSLContext.wrap_socket

def _handshake_in_request_thread(self, sock, server_side=False, do_handshake_on_connect=True, *a, **kw):
    return _wrap_socket(self, sock, server_side, do_handshake_on_connect and not server_side, *a, **kw)

ssl.SSLContext.wrap_socket = _handshake_in_request_thread
"""
# The fake driver reports no processors, memory size, CPU count or BIOS version (sushy-tools 2.2.0
# leaves them NotSupported): with this prelude it reports the ones a fake system lists under
# "processors" (dicts with id/Id, socket, vendor, model, cores, threads), "total_memory_gb",
# "total_cpus" and "bios_version", and keeps the BIOS version UpdateService.SimpleUpdate sets (its
# own code bumps the minor number and answers 204 + Location of its one static Task, "Completed").
# Storage and drives need no patch (SUSHY_EMULATOR_STORAGE/DRIVES).
FAKE_HARDWARE = """\
from sushy_tools import error as _error
from sushy_tools.emulator.resources.systems import fakedriver as _fd

def _reported(key, wrap=None):
    def get(self, identity):
        value = self._get(identity).get(key)
        if value is None:
            raise _error.NotSupportedError(f"fake system has no {key}")
        return wrap(value) if wrap else value
    return get

_fd.FakeDriver.get_processors = _reported("processors")
_fd.FakeDriver.get_total_memory = _reported("total_memory_gb")
_fd.FakeDriver.get_total_cpus = _reported("total_cpus")
_fd.FakeDriver.get_versions = _reported("bios_version", lambda v: {"BiosVersion": v})


def _set_versions(self, identity, firmware_versions):
    # What the libvirt driver stores (sushy-tools 2.2.0's fake driver leaves it NotSupported, so
    # its UpdateService.SimpleUpdate answered 500): the BIOS version its SimpleUpdate computed.
    self._update(identity, bios_version=firmware_versions["BiosVersion"])


_fd.FakeDriver.set_versions = _set_versions
"""
# sushy-tools' InsertMedia downloads the whole image into the emulator (with no timeout) before it
# answers: 100 emulated BMCs fetching a 54 MB medium each is 5.4 GB through one Python process,
# which on a loaded 2-core machine answers InsertMedia after the client's timeout (a retry starts
# another download beside the first). A real BMC checks the image answers and reads the rest
# when the host boots from it. With this prelude the emulator does that: it fetches the first
# 64 KiB (the signed URL is checked and the medium served as usual, a 4xx/5xx still fails the
# insert) with a 30 s timeout, and stops.
LAZY_MEDIA_FETCH = """\
import requests as _requests
from sushy_tools.emulator.resources import vmedia as _vmedia

class _Requests:
    def __getattr__(self, name):
        return getattr(_requests, name)

    @staticmethod
    def get(*args, **kwargs):
        kwargs.setdefault("timeout", 30)
        return _requests.get(*args, **kwargs)

_write_whole = _vmedia._write_from_response

def _write_head(image_url, rsp, tmp_file):
    class _Head:
        headers = rsp.headers

        @staticmethod
        def iter_content(chunk_size=8192):
            got = 0
            for chunk in rsp.iter_content(chunk_size=chunk_size):
                yield chunk
                got += len(chunk)
                if got >= 65536:
                    return

    return _write_whole(image_url, _Head, tmp_file)

_vmedia.requests = _Requests()
_vmedia._write_from_response = _write_head
"""
_RUN = """\
import sys
from sushy_tools.emulator.main import main
sys.argv[0] = "sushy-emulator"
sys.exit(main())
"""


def emulator_with_two_drives(
    systems: list[dict], owner: dict, disk_bytes: int, **controller: object
) -> RedfishEmulator:
    """An emulator (FAKE_HARDWARE prelude) whose ``owner`` system has one storage controller with
    two drives, D1 (SAS) and D2 (SATA), of ``disk_bytes`` each; ``controller`` adds properties to
    the storage resource (e.g. ``StorageControllers``). Started; the caller stops it."""
    storage = {
        owner["uuid"]: [{"Id": "1", "Name": "Local Storage Controller", **controller, "Drives": ["D1", "D2"]}]
    }
    drives = {
        (owner["uuid"], "1"): [
            {"Id": "D1", "Name": "Drive 1", "CapacityBytes": disk_bytes, "Protocol": "SAS"},
            {"Id": "D2", "Name": "Drive 2", "CapacityBytes": disk_bytes, "Protocol": "SATA"},
        ]
    }
    return RedfishEmulator(
        systems,
        prelude=FAKE_HARDWARE,
        extra_config={"SUSHY_EMULATOR_STORAGE": storage, "SUSHY_EMULATOR_DRIVES": drives},
    ).start()


def fake_system(
    name: str,
    *,
    uuid: str | None = None,
    macs: list[str] | tuple[str, ...] = (),
    power_state: str = "Off",
    **extra,
) -> dict:
    """One SUSHY_EMULATOR_FAKE_SYSTEMS entry; a random locally administered MAC if none."""
    macs = list(macs) or [random_mac()]
    return {
        "uuid": uuid or str(uuidlib.uuid4()),
        "name": name,
        "power_state": power_state,
        "external_notifier": False,
        "nics": [{"mac": m} for m in macs],
        **extra,
    }


def random_mac() -> str:
    return "52:54:00:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(3))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedfishEmulator:
    """A sushy-emulator serving fake BMCs on 127.0.0.1, as a context manager.

    ``systems``: dicts as in SUSHY_EMULATOR_FAKE_SYSTEMS (see `fake_system`); missing
    uuid/name/power_state/nics are filled in. Default: two systems.
    ``auth``: basic auth with a bcrypt htpasswd file (service root stays open, the rest
    answers 401 without credentials); ``username``/``password`` default to
    "admin"/random.
    ``instant_power``: power changes apply at the next GET instead of after 1-11 s.
    ``ssl_cert``/``ssl_key``: PEM files; the emulator then serves HTTPS (``url`` is https://…;
    the lab's own client does not verify it). ``port``: listen here (e.g. a restart with
    another certificate at the same address) instead of a free port. ``prelude``: Python run in
    the emulator's process before it starts (e.g. :data:`FAKE_HARDWARE`).
    """

    def __init__(
        self,
        systems: list[dict] | None = None,
        *,
        auth: bool = True,
        username: str = "admin",
        password: str | None = None,
        instant_power: bool = True,
        sushy_emulator: str | None = None,
        install: bool = True,
        extra_config: dict | None = None,
        startup_timeout: float = 30.0,
        ssl_cert: str | None = None,
        ssl_key: str | None = None,
        port: int = 0,
        prelude: str = "",
    ) -> None:
        if systems is None:
            systems = [fake_system("node1"), fake_system("node2")]
        self.systems = [self._complete(s, i) for i, s in enumerate(systems, 1)]
        self.auth = auth
        self.username = username if auth else None
        self.password = (password or secrets.token_urlsafe(12)) if auth else None
        self.instant_power = instant_power
        self.sushy_emulator = sushy_emulator
        self.install = install
        self.extra_config = dict(extra_config or {})
        self.startup_timeout = startup_timeout
        self.host = "127.0.0.1"
        self.ssl_cert, self.ssl_key = ssl_cert, ssl_key
        self.fixed_port = port
        self.port = port
        self.prelude = prelude
        self.workdir = ""
        self.log_path = ""
        self.timings: dict[str, float] = {}
        self._proc: subprocess.Popen | None = None

    @staticmethod
    def _complete(system: dict, index: int) -> dict:
        s = dict(system)
        s.setdefault("uuid", str(uuidlib.uuid4()))
        s.setdefault("name", f"node{index}")
        s.setdefault("power_state", "Off")
        s.setdefault("external_notifier", False)
        s.setdefault("nics", [{"mac": random_mac()}])
        return s

    # -- public view ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:40123 (Redfish root is url + '/redfish/v1')."""
        return f"{'https' if self.ssl_cert else 'http'}://{self.host}:{self.port}"

    @property
    def system_ids(self) -> list[str]:
        """Redfish ids of the systems (the fake driver uses the UUID; GET by name → 307)."""
        return [s["uuid"] for s in self.systems]

    @property
    def auth_tuple(self) -> tuple[str, str] | None:
        return (self.username, self.password) if self.auth else None

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> RedfishEmulator:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> RedfishEmulator:
        t0 = time.monotonic()
        exe = find_sushy_emulator(self.sushy_emulator, install=self.install)
        python = emulator_python(exe)
        self.timings["find_or_install"] = time.monotonic() - t0
        self.workdir = tempfile.mkdtemp(prefix="karios-redfish-")
        state_dir = os.path.join(self.workdir, "state")
        tmp_dir = os.path.join(self.workdir, "tmp")
        os.makedirs(state_dir)
        os.makedirs(tmp_dir)
        config = {
            "SUSHY_EMULATOR_LISTEN_IP": self.host,
            "SUSHY_EMULATOR_FAKE_DRIVER": True,
            "SUSHY_EMULATOR_FAKE_SYSTEMS": self.systems,
            "SUSHY_EMULATOR_STATE_DIR": state_dir,
            **self.extra_config,
        }
        if self.ssl_cert and self.ssl_key:
            config["SUSHY_EMULATOR_SSL_CERT"] = self.ssl_cert
            config["SUSHY_EMULATOR_SSL_KEY"] = self.ssl_key
        if self.auth:
            t = time.monotonic()
            auth_file = os.path.join(self.workdir, "htpasswd")
            with open(auth_file, "w") as fh:
                fh.write(bcrypt_htpasswd_line(self.username, self.password, python) + "\n")
            config["SUSHY_EMULATOR_AUTH_FILE"] = auth_file
            self.timings["htpasswd"] = time.monotonic() - t
        if self.instant_power or self.ssl_cert or self.prelude:
            if not python:
                raise RuntimeError(f"instant_power/TLS need the python of {exe}; pass instant_power=False")
            launcher = os.path.join(self.workdir, "launch_sushy.py")
            with open(launcher, "w") as fh:
                fh.write(
                    (_NO_POWER_DELAY if self.instant_power else "")
                    + (_LAZY_TLS_HANDSHAKE if self.ssl_cert else "")
                    + self.prelude
                    + _RUN
                )
            argv_head = [python, launcher]
        else:
            argv_head = [exe]
        self.log_path = os.path.join(self.workdir, "emulator.log")
        env = dict(os.environ, TMPDIR=tmp_dir, PYTHONUNBUFFERED="1")
        env.pop("SUSHY_EMULATOR_CONFIG", None)
        try:
            for _attempt in range(5):  # a free port may be taken between probe and bind
                t = time.monotonic()
                self.port = self.fixed_port or _free_port()
                config["SUSHY_EMULATOR_LISTEN_PORT"] = self.port
                cfg_path = os.path.join(self.workdir, "emulator.conf")
                with open(cfg_path, "w") as fh:
                    for key, value in config.items():
                        fh.write(f"{key} = {value!r}\n")
                with open(self.log_path, "ab") as log:
                    self._proc = subprocess.Popen(
                        [*argv_head, "--config", cfg_path],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=self.workdir,
                        start_new_session=True,
                    )
                if self._wait_ready():
                    self.timings["ready"] = time.monotonic() - t
                    self.timings["start_total"] = time.monotonic() - t0
                    return self
                if "Address already in use" not in self.log() or self.fixed_port:
                    break
            raise RuntimeError(f"sushy-emulator did not come up:\n{self.log()[-4000:]}")
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(
                    self.url + "/redfish/v1/", timeout=2, context=self._client_tls()
                ) as resp,
            ):
                if resp.status == 200:
                    return True
            time.sleep(0.05)
        return False

    def _client_tls(self) -> ssl.SSLContext | None:
        """The lab's own client does not verify the emulator (it checks the lab, not TLS)."""
        if not self.ssl_cert:
            return None
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def requests_seen(self, since: int = 0) -> list[str]:
        """HTTP request lines the emulator logged after offset ``since`` of its log."""
        return [line for line in self.log()[since:].splitlines() if '"' in line and " HTTP/1." in line]

    def stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""

    def log(self) -> str:
        """What the emulator printed (its request log included)."""
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as fh:
            return fh.read()
        return ""

    # -- tiny client for tests of the lab itself ---------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        *,
        auth: bool | tuple[str, str] = True,
        timeout: float = 10.0,
    ) -> tuple[int, dict | None]:
        """(status, JSON body or None) for `path` (absolute Redfish path), no redirects.

        ``auth``: True = the emulator's credentials, False = none, or (user, password).
        """
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        creds = auth if isinstance(auth, tuple) else self.auth_tuple if auth else None
        if creds:
            token = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        opener = urllib.request.build_opener(
            _NoRedirect, urllib.request.HTTPSHandler(context=self._client_tls())
        )
        try:
            with opener.open(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    def get(self, path: str, **kw) -> dict:
        """GET `path`; the JSON body, or AssertionError unless 200."""
        status, body = self.request("GET", path, **kw)
        if status != 200:
            raise AssertionError(f"GET {path} -> {status}: {body}")
        return body or {}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
