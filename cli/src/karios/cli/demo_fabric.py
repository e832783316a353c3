"""The fabric of ``karios demo --fabric``: compute nodes as network namespaces running real OpenSSH
(and FRR once the fabric is applied) plus an FRR route reflector, on this machine (root only).

Two parts, one definition each:

- the lab (:class:`FabricLab` and its helpers): namespaces, veths, a bridge, sshd per node, the
  route reflector, and a stop that removes all of it. The tests use it too, through
  ``tests/lab/fabric_lab.py`` (which re-exports this module; see tests/lab/README.md);
- the demo (:func:`demo_fabric_config`, :func:`adopt_and_configure`, …): what ``karios demo
  --fabric`` does with a started lab through the gateway (docs/cli.md).

Stdlib only (the lab self-test runs it with a bare ``python3``). Addresses: only 198.18.0.0/15
(RFC 2544 benchmarking space), never routed anywhere.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

PACKAGES = ("openssh-server", "frr", "frr-pythontools", "iproute2")
LOCK_DIR = "/run/karios-lab"


def missing_packages(packages=PACKAGES) -> list[str]:
    """Debian packages from `packages` that `dpkg -s` does not report as installed."""
    missing = []
    for pkg in packages:
        out = subprocess.run(["dpkg", "-s", pkg], capture_output=True, text=True)
        if out.returncode != 0 or "Status: install ok installed" not in out.stdout:
            missing.append(pkg)
    return missing


def ensure_packages(packages=PACKAGES, timeout: float = 900.0) -> list[str]:
    """Install missing lab packages with apt-get; return what was installed.

    Warm run (all installed) costs only the `dpkg -s` calls. Package scripts are kept
    from starting daemons (a system-wide sshd or FRR in the root namespace) by a
    temporary policy-rc.d, and any FRR the install still managed to start is stopped.
    """
    if not missing_packages(packages):
        return []
    lock_fd = _acquire_lock("apt.lock", timeout)  # parallel pytest workers
    try:
        missing = missing_packages(packages)
        if not missing:
            return []
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", NEEDRESTART_MODE="l")
        policy = "/usr/sbin/policy-rc.d"
        own_policy = not os.path.exists(policy)
        if own_policy:
            with open(policy, "w") as fh:
                fh.write("#!/bin/sh\n# karios lab: no daemon starts during install\nexit 101\n")
            os.chmod(policy, 0o755)  # noqa: S103 (an executable dpkg runs)
        try:
            cmd = ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=600", "install", *missing]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                # Stale or empty package lists on a fresh machine.
                subprocess.run(
                    ["apt-get", "-q", "update"], env=env, capture_output=True, text=True, timeout=timeout
                )
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                raise RuntimeError(
                    f"apt-get install {missing} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
                )
        finally:
            if own_policy:
                os.unlink(policy)
        if "frr" in missing:
            _stop_system_frr()
        still = missing_packages(packages)
        if still:
            raise RuntimeError(f"packages still missing after apt-get: {still}")
        return missing
    finally:
        os.close(lock_fd)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_system_frr() -> None:
    """Stop an FRR that a package script started in the root namespace, if any."""
    alive = False
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir("/run/frr"):
            if name.endswith(".pid"):
                pid = _read_pid(os.path.join("/run/frr", name))
                alive |= pid > 0 and _pid_alive(pid)
    if alive:
        subprocess.run(["/usr/lib/frr/frrinit.sh", "stop"], capture_output=True, timeout=60)


def skip_reason() -> str | None:
    """Why the fabric lab cannot run here (for pytest.skip), or None when it can."""
    if os.geteuid() != 0:
        return "fabric lab needs root (network namespaces, bind mounts)"
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        if not shutil.which(tool):
            return f"fabric lab needs `{tool}` on PATH"
    probe = f"karios-probe-{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"cannot create network namespaces: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


# -- addressing ---------------------------------------------------------------------------
# Everything stays in 198.18.0.0/15 (RFC 2544 benchmarking space): never routed anywhere.

FABRIC_IP = "198.18.0.1"  # fabric bridge; the route reflector listens here
HOST_IP = "198.18.0.254"  # root-namespace end of the optional host link
UNDERLAY_PREFIX = 24
MAX_NODES = 240


def underlay_ip(index: int) -> str:
    """Node N (1-based) gets 198.18.0.(10+N): 198.18.0.11, .12, ..."""
    return f"198.18.0.{10 + index}"


def loopback_ip(index: int) -> str:
    """Node N (1-based) gets the /32 198.19.0.(10+N) on `lo`."""
    return f"198.19.0.{10 + index}"


@dataclasses.dataclass
class LabNode:
    """One compute node: a network namespace with its own sshd, hostname and /etc/frr."""

    index: int
    name: str  # hostname inside the node, e.g. "node1"
    netns: str  # `ip netns` name, unique per lab
    underlay_ip: str
    loopback_ip: str
    mtu: int
    ssh_host: str
    ssh_port: int
    username: str
    private_key_path: str
    host_public_key: str  # "ssh-ed25519 AAAA..."
    host_key_fingerprint: str  # "SHA256:..."
    etc_frr_dir: str  # host path bind-mounted on the node's /etc/frr
    run_frr_dir: str  # host path bind-mounted on the node's /run/frr
    sshd_pid: int = 0


_ACTIVE_RUNS: set[str] = set()  # run ids of labs alive in this process
_SEQ = iter(range(1_000_000))


def _remove_stale_host_links() -> None:
    """Delete root-namespace links still holding the host address (left by a lab whose namespace
    lingers after deletion); called with the host-link lock held, so none of them is live."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "to", f"{HOST_IP}/32"], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        name = line.split()[1].split("@")[0]
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


class FabricLab:
    """Compute nodes as network namespaces with real OpenSSH and (optionally) a BGP RR.

    Topology::

        root ns  --(optional host link, 198.18.0.254/24)--+
        fabric ns: bridge br0 198.18.0.1/24, MTU 9000, FRR route reflector (AS 65000)
          +-- veth --> nodeN ns: eth0 -> br-underlay 198.18.0.(10+N)/24, lo 198.19.0.(10+N)/32

    Each node runs sshd on underlay_ip:22 inside its own UTS namespace (hostname nodeN)
    and a mount namespace where per-node dirs are bind-mounted on /etc/frr and /run/frr.
    FRR is not running on nodes and their /etc/frr starts empty (``seed_frr_etc=True``
    copies the package defaults in instead). The filesystem, dpkg database and PID space
    are shared by all nodes and the host.

    The host link (default on) lets the test process (root namespace) reach the nodes
    directly; it adds 198.18.0.0/24 to the root namespace, so only one lab with a host
    link may exist per machine at a time: a lock file serialises them.
    """

    def __init__(
        self,
        n_nodes: int = 3,
        prefix: str = "kl",
        mtu_overrides: dict[str | int, int] | None = None,
        with_rr: bool = True,
        *,
        host_link: bool = True,
        fabric_mtu: int = 9000,
        seed_frr_etc: bool = False,
        install: bool = True,
        host_link_lock_timeout: float = 600.0,
        rr_config: str | None = None,
        rr_daemons: tuple[str, ...] = ("bgpd",),
    ) -> None:
        if not 1 <= n_nodes <= MAX_NODES:
            raise ValueError(f"n_nodes must be within 1..{MAX_NODES}")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", prefix):
            raise ValueError("prefix: 1-6 chars of [a-z0-9], starting with a letter")
        self.n_nodes = n_nodes
        self.prefix = prefix
        self.mtu_overrides = dict(mtu_overrides or {})
        self.with_rr = with_rr
        self.host_link = host_link
        self.fabric_mtu = fabric_mtu
        self.seed_frr_etc = seed_frr_etc
        self.install = install
        self.host_link_lock_timeout = host_link_lock_timeout
        # The RR's frr.conf (default: the lab's own RR); e.g. Karios's rendered switch config,
        # which must contain a `bgp listen range` (start() waits for it to be loaded).
        self.rr_config = rr_config
        self.rr_daemons = rr_daemons

        self.run_id = f"{prefix}-{os.getpid()}-{next(_SEQ)}"
        self.fabric_netns = f"{self.run_id}-fabric"
        self.host_ifname = f"{prefix}h{os.getpid()}{self.run_id.rsplit('-', 1)[1]}"[:15]
        self.workdir = ""
        self.client_key_path = ""
        self.client_public_key = ""
        self.known_hosts_path = ""
        self.rr_etc_frr_dir = ""
        self.rr_run_frr_dir = ""
        self.nodes: list[LabNode] = []
        self.timings: dict[str, float] = {}
        self._procs: list[subprocess.Popen] = []
        self._host_lock_fd: int | None = None
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> FabricLab:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> FabricLab:
        t0 = time.monotonic()
        if self.install:
            ensure_packages()
        self.timings["packages"] = time.monotonic() - t0
        cleanup_leftovers(self.prefix)
        _ACTIVE_RUNS.add(self.run_id)
        self._started = True
        atexit.register(self.stop)
        try:
            t = time.monotonic()
            self._make_workdir()
            self.timings["keys"] = time.monotonic() - t
            t = time.monotonic()
            self._build_network()
            self.timings["network"] = time.monotonic() - t
            t = time.monotonic()
            self._start_sshds()
            self.timings["sshd"] = time.monotonic() - t
            if self.with_rr:
                t = time.monotonic()
                self._start_rr()
                self.timings["rr"] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        self.timings["start_total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Kill every process in the lab's namespaces, delete them and the workdir."""
        if not self._started:
            return
        t = time.monotonic()
        self._started = False
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self.host_link:
            # Delete the host end explicitly: a namespace can outlive `ip netns del` for minutes
            # (lingering sockets), and its veth would keep routing the lab subnet in the root ns.
            subprocess.run(["ip", "link", "del", self.host_ifname], capture_output=True, check=False)
        namespaces = [n.netns for n in self.nodes] + [self.fabric_netns]
        namespaces += [ns for ns in _list_netns() if ns.startswith(self.run_id + "-")]
        for ns in dict.fromkeys(namespaces):
            _destroy_netns(ns)
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(timeout=5)
        self._procs.clear()
        if self._host_lock_fd is not None:
            os.close(self._host_lock_fd)
            self._host_lock_fd = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        _ACTIVE_RUNS.discard(self.run_id)
        self.timings["stop"] = time.monotonic() - t

    # -- access ------------------------------------------------------------------------

    def node(self, ref: LabNode | str | int) -> LabNode:
        """A node by LabNode, name ("node2"), netns name or 1-based index."""
        if isinstance(ref, LabNode):
            return ref
        for n in self.nodes:
            if ref in (n.index, n.name, n.netns):
                return n
        raise KeyError(f"no lab node {ref!r}")

    def ssh_argv(self, node: LabNode | str | int, *command: str) -> list[str]:
        """`ssh` argv reaching `node` from the host (needs host_link) with the lab key."""
        n = self.node(node)
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            n.private_key_path,
            "-o",
            f"UserKnownHostsFile={self.known_hosts_path}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=5",
            "-p",
            str(n.ssh_port),
            f"{n.username}@{n.ssh_host}",
            *command,
        ]

    def node_exec(
        self,
        node: LabNode | str | int,
        cmd: str | Sequence[str],
        *,
        check: bool = False,
        timeout: float = 60.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run `cmd` inside the node (its netns, mount ns with /etc/frr, hostname).

        A string runs through `sh -c`. Enters the namespaces of the node's sshd, so what
        it sees is what an SSH session sees. Output is captured as text.
        """
        n = self.node(node)
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return subprocess.run(
            ["nsenter", "-t", str(n.sshd_pid), "-m", "-n", "-u", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=check,
        )

    def node_pids(self, node: LabNode | str | int) -> list[int]:
        """PIDs of every process in the node's network namespace (sshd included)."""
        return _netns_pids(self.node(node).netns)

    def rr_vtysh(self, cmd: str, *, timeout: float = 30.0) -> str:
        """Run one vtysh command on the route reflector; return its output."""
        if not self.with_rr:
            raise RuntimeError("lab started with with_rr=False")
        pid = _read_pid(os.path.join(self.rr_run_frr_dir, "zebra.pid"))
        if not pid:
            raise RuntimeError("route reflector is not running")
        res = subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "-n", "--", "vtysh", "-c", cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if res.returncode != 0:
            raise RuntimeError(f"rr vtysh {cmd!r} failed ({res.returncode}): {res.stdout}{res.stderr}")
        return res.stdout

    def rr_paste(self, text: str, *, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Paste `text` on the route reflector as an operator would: `configure terminal`, then
        each line in one vtysh session (the context of `router bgp` carries over lines)."""
        pid = _read_pid(os.path.join(self.rr_run_frr_dir, "zebra.pid"))
        if not pid:
            raise RuntimeError("route reflector is not running")
        argv = ["vtysh", "-c", "configure terminal"]
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("!"):
                argv += ["-c", line.strip()]
        return subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "-n", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def rr_shell(self, command: str, *, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a shell command (e.g. a snippet's verify command) on the route reflector."""
        pid = _read_pid(os.path.join(self.rr_run_frr_dir, "zebra.pid"))
        if not pid:
            raise RuntimeError("route reflector is not running")
        return subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "-n", "--", "sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def rr_vtysh_json(self, cmd: str, *, timeout: float = 30.0):
        """Run a `... json` vtysh command on the route reflector; return parsed JSON."""
        return json.loads(self.rr_vtysh(cmd, timeout=timeout) or "{}")

    def rr_evpn_peer_states(self) -> dict[str, str]:
        """{peer address: BGP state} of the RR's l2vpn evpn sessions."""
        data = self.rr_vtysh_json("show bgp l2vpn evpn summary json")
        return {ip: p.get("state", "") for ip, p in data.get("peers", {}).items()}

    # -- building ----------------------------------------------------------------------

    def _make_workdir(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix=f"karios-fabric-{self.run_id}-")
        os.chmod(self.workdir, 0o755)  # noqa: S103 (sshd reads authorized_keys here; the key is 0600)
        self.client_key_path = os.path.join(self.workdir, "id_ed25519")
        _keygen(self.client_key_path, "karios-lab-client")
        with open(self.client_key_path + ".pub") as fh:
            self.client_public_key = fh.read().strip()
        with open(os.path.join(self.workdir, "authorized_keys"), "w") as fh:
            fh.write(self.client_public_key + "\n")
        self.known_hosts_path = os.path.join(self.workdir, "known_hosts")
        known = []
        for i in range(1, self.n_nodes + 1):
            name = f"node{i}"
            ndir = os.path.join(self.workdir, name)
            os.makedirs(ndir)
            etc, run = os.path.join(ndir, "etc-frr"), os.path.join(ndir, "run-frr")
            _make_frr_dirs(etc, run, seed=self.seed_frr_etc)
            _make_node_home(os.path.join(ndir, "root-home"))
            hostkey = os.path.join(ndir, "ssh_host_ed25519_key")
            _keygen(hostkey, f"root@{name}")
            with open(hostkey + ".pub") as fh:
                pub = " ".join(fh.read().split()[:2])
            fp = subprocess.run(
                ["ssh-keygen", "-lf", hostkey + ".pub"], capture_output=True, text=True, check=True
            ).stdout.split()[1]
            ip = underlay_ip(i)
            self.nodes.append(
                LabNode(
                    index=i,
                    name=name,
                    netns=f"{self.run_id}-{name}",
                    underlay_ip=ip,
                    loopback_ip=loopback_ip(i),
                    mtu=self._mtu_for(i, name),
                    ssh_host=ip,
                    ssh_port=22,
                    username="root",
                    private_key_path=self.client_key_path,
                    host_public_key=pub,
                    host_key_fingerprint=fp,
                    etc_frr_dir=etc,
                    run_frr_dir=run,
                )
            )
            known.append(f"{ip} {pub}")
        with open(self.known_hosts_path, "w") as fh:
            fh.write("\n".join(known) + "\n")
        if self.with_rr:
            rdir = os.path.join(self.workdir, "rr")
            os.makedirs(rdir)
            self.rr_etc_frr_dir = os.path.join(rdir, "etc-frr")
            self.rr_run_frr_dir = os.path.join(rdir, "run-frr")
            _make_frr_dirs(self.rr_etc_frr_dir, self.rr_run_frr_dir, seed=True)

    def _mtu_for(self, index: int, name: str) -> int:
        for key in (name, index, str(index)):
            if key in self.mtu_overrides:
                return int(self.mtu_overrides[key])
        return self.fabric_mtu

    def _build_network(self) -> None:
        fab = self.fabric_netns
        for ns in [fab] + [n.netns for n in self.nodes]:
            _run(["ip", "netns", "add", ns])
        lines = [
            "link set lo up",
            f"link add br0 mtu {self.fabric_mtu} type bridge forward_delay 0 stp_state 0",
            f"addr add {FABRIC_IP}/{UNDERLAY_PREFIX} dev br0",
            "link set br0 up",
        ]
        for n in self.nodes:
            # Fabric side stays at the fabric MTU; the node side carries the drift.
            lines += [
                f"link add vn{n.index} mtu {self.fabric_mtu} type veth "
                f"peer name eth0 mtu {n.mtu} netns {n.netns}",
                f"link set vn{n.index} master br0",
                f"link set vn{n.index} up",
            ]
        # A bridge follows its smallest port's MTU until its own MTU is set explicitly.
        lines.append(f"link set br0 mtu {self.fabric_mtu}")
        _ip_batch(fab, lines)
        for n in self.nodes:
            _ip_batch(
                n.netns,
                [
                    "link set lo up",
                    f"addr add {n.loopback_ip}/32 dev lo",
                    f"link add br-underlay mtu {n.mtu} type bridge forward_delay 0 stp_state 0",
                    "link set eth0 master br-underlay",
                    f"link set br-underlay mtu {n.mtu}",
                    f"addr add {n.underlay_ip}/{UNDERLAY_PREFIX} dev br-underlay",
                    "link set eth0 up",
                    "link set br-underlay up",
                ],
            )
        for n in self.nodes:
            _wait_carrier(n.netns, "br-underlay")
        if self.host_link:
            self._host_lock_fd = _acquire_lock("host-link.lock", self.host_link_lock_timeout)
            _remove_stale_host_links()
            _run(
                [
                    "ip",
                    "link",
                    "add",
                    self.host_ifname,
                    "mtu",
                    str(self.fabric_mtu),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "host",
                    "mtu",
                    str(self.fabric_mtu),
                    "netns",
                    fab,
                ]
            )
            _ip_batch(
                fab, ["link set host master br0", "link set host up", f"link set br0 mtu {self.fabric_mtu}"]
            )
            _run(["ip", "addr", "add", f"{HOST_IP}/{UNDERLAY_PREFIX}", "dev", self.host_ifname])
            _run(["ip", "link", "set", self.host_ifname, "up"])

    def _start_sshds(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        os.makedirs("/run/frr", exist_ok=True)  # mount point only
        os.makedirs("/etc/frr", exist_ok=True)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        for n in self.nodes:
            ndir = os.path.dirname(n.etc_frr_dir)
            cfg = os.path.join(ndir, "sshd_config")
            with open(cfg, "w") as fh:
                fh.write(
                    _SSHD_CONFIG.format(
                        ip=n.underlay_ip,
                        port=n.ssh_port,
                        dir=ndir,
                        authorized_keys=os.path.join(self.workdir, "authorized_keys"),
                    )
                )
            # ip netns exec: own netns + private (slave) mount ns; unshare --uts: hostname.
            # The node's own /root (a fresh Debian root home): the host's dotfiles (a developer's
            # ~/.bashrc, which bash sources for every SSH command) are not the node's.
            # Every step execs, so the Popen pid is sshd's pid.
            script = (
                'set -e; hostname "$1"; mount --bind "$2" /etc/frr; '
                'mount --bind "$3" /run/frr; mount --bind "$6" /root; exec "$4" -D -e -f "$5"'
            )
            with open(os.path.join(ndir, "sshd.log"), "wb") as log:
                proc = subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        n.netns,
                        "unshare",
                        "--uts",
                        "--",
                        "sh",
                        "-c",
                        script,
                        "sh",
                        n.name,
                        n.etc_frr_dir,
                        n.run_frr_dir,
                        sshd,
                        cfg,
                        os.path.join(ndir, "root-home"),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            self._procs.append(proc)
            n.sshd_pid = proc.pid
        deadline = time.monotonic() + 15
        for n, proc in zip(self.nodes, self._procs, strict=True):
            pidfile = os.path.join(os.path.dirname(n.etc_frr_dir), "sshd.pid")
            while _read_pid(pidfile) != proc.pid:
                if proc.poll() is not None or time.monotonic() > deadline:
                    with open(os.path.join(os.path.dirname(pidfile), "sshd.log")) as fh:
                        raise RuntimeError(f"sshd on {n.name} did not start:\n{fh.read()}")
                time.sleep(0.01)

    def _start_rr(self) -> None:
        with open(os.path.join(self.rr_etc_frr_dir, "daemons"), "a") as fh:
            fh.write("\n# karios lab route reflector\n" + "".join(f"{d}=yes\n" for d in self.rr_daemons))
        conf = os.path.join(self.rr_etc_frr_dir, "frr.conf")
        with open(conf, "w") as fh:
            fh.write(self.rr_config or _RR_CONFIG.format(fabric_ip=FABRIC_IP, prefix=UNDERLAY_PREFIX))
        _chown_frr(conf)
        log = os.path.join(os.path.dirname(self.rr_etc_frr_dir), "frrinit.log")
        script = (
            'set -e; mount --bind "$1" /etc/frr; mount --bind "$2" /run/frr; '
            "exec /usr/lib/frr/frrinit.sh start"
        )
        with open(log, "wb") as fh:
            res = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.fabric_netns,
                    "unshare",
                    "-m",
                    "--",
                    "sh",
                    "-c",
                    script,
                    "sh",
                    self.rr_etc_frr_dir,
                    self.rr_run_frr_dir,
                ],
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=60,
            )
        if res.returncode != 0:
            with open(log) as fh:
                raise RuntimeError(f"route reflector did not start:\n{fh.read()}")
        # watchfrr loads frr.conf (vtysh -b) after the daemons answer: wait for it.
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                if "bgp listen range" in self.rr_vtysh("show running-config", timeout=5):
                    return
            if time.monotonic() > deadline:
                with open(log) as fh:
                    raise RuntimeError(f"route reflector config not loaded:\n{fh.read()}")
            time.sleep(0.05)


_SSHD_CONFIG = """\
# karios fabric lab node sshd
Port {port}
ListenAddress {ip}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {authorized_keys}
UsePAM no
StrictModes no
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
PrintMotd no
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
LogLevel INFO
"""

_RR_CONFIG = """\
frr defaults traditional
hostname rr
log file /run/frr/frr.log informational
service integrated-vtysh-config
!
router bgp 65000
 bgp router-id {fabric_ip}
 bgp cluster-id {fabric_ip}
 no bgp default ipv4-unicast
 bgp log-neighbor-changes
 neighbor NODES peer-group
 neighbor NODES remote-as 65000
 neighbor NODES timers 3 9
 bgp listen range 198.18.0.0/{prefix} peer-group NODES
 !
 address-family ipv4 unicast
  neighbor NODES activate
  neighbor NODES route-reflector-client
 exit-address-family
 !
 address-family l2vpn evpn
  neighbor NODES activate
  neighbor NODES route-reflector-client
 exit-address-family
exit
!
"""


# -- leftovers and teardown -----------------------------------------------------------


def cleanup_leftovers(prefix: str = "kl") -> list[str]:
    """Remove namespaces and workdirs of labs with `prefix` whose owner process is gone.

    Labs of live processes (parallel pytest workers) are left alone. Returns the removed
    namespace names.
    """
    removed = []
    pat = re.compile(rf"^{re.escape(prefix)}-(\d+)-(\d+)-")
    for ns in _list_netns():
        m = pat.match(ns)
        if m and _run_is_dead(prefix, m):
            _destroy_netns(ns)
            removed.append(ns)
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if name.startswith("karios-fabric-"):
            m = pat.match(name[len("karios-fabric-") :])
            if m and _run_is_dead(prefix, m):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    return removed


def _run_is_dead(prefix: str, m: re.Match) -> bool:
    pid = int(m.group(1))
    if pid == os.getpid():
        return f"{prefix}-{m.group(1)}-{m.group(2)}" not in _ACTIVE_RUNS
    return not _pid_alive(pid)


def _list_netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_pids(ns: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _destroy_netns(ns: str) -> None:
    """Kill every process in netns `ns` (never by name: the PID space is shared), delete it."""
    if ns not in _list_netns():
        return
    pids = _netns_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = _netns_pids(ns)
    # Whatever ignored SIGTERM (or was respawned by watchfrr meanwhile) gets SIGKILL.
    for _ in range(50):
        pids = _netns_pids(ns)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# -- small helpers ---------------------------------------------------------------------


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def _ip_batch(ns: str, lines: list[str]) -> None:
    res = subprocess.run(
        ["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True, text=True
    )
    if res.returncode != 0:
        raise RuntimeError(f"ip -n {ns} -batch failed: {res.stderr.strip()}\n" + "\n".join(lines))


def _wait_carrier(ns: str, ifname: str, timeout: float = 5.0) -> None:
    """Wait until `ifname` in `ns` has carrier (operstate UP), or `timeout` has passed.

    A bridge's carrier comes up asynchronously after its port does (the kernel's link watch runs
    up to a second later): a lab handed over before that changes under the first test that looks.
    """
    path = f"/sys/class/net/{ifname}/operstate"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = subprocess.run(["ip", "netns", "exec", ns, "cat", path], capture_output=True, text=True)
        if res.stdout.strip() == "up":
            return
        time.sleep(0.05)


def _acquire_lock(name: str, timeout: float) -> int:
    os.makedirs(LOCK_DIR, exist_ok=True)
    fd = os.open(os.path.join(LOCK_DIR, name), os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise TimeoutError(f"another lab holds {name} for more than {timeout:.0f} s") from None
            time.sleep(0.2)


def _keygen(path: str, comment: str) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


def _read_pid(path: str) -> int:
    try:
        with open(path) as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _chown_frr(path: str) -> None:
    shutil.chown(path, "frr", "frr")


def _make_node_home(path: str) -> None:
    """A node's /root as Debian creates it (base-files' dot.bashrc/dot.profile, else empty)."""
    os.makedirs(path, mode=0o700)
    for name in ("bashrc", "profile"):
        src = f"/usr/share/base-files/dot.{name}"
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(path, f".{name}"))


def _make_frr_dirs(etc: str, run: str, *, seed: bool) -> None:
    """Per-instance /etc/frr (empty, or the package defaults) and /run/frr, owned by frr."""
    if seed:
        shutil.copytree(_package_frr_etc(), etc)
    else:
        os.makedirs(etc)
    os.makedirs(run)
    for d in (etc, run):
        _chown_frr(d)
        for name in os.listdir(d):
            _chown_frr(os.path.join(d, name))
    os.chmod(etc, 0o750)  # noqa: S103 (FRR's own group)
    os.chmod(run, 0o755)  # noqa: S103 (vtysh of any user, as the package sets /run/frr)


def _package_frr_etc() -> str:
    """The root namespace's /etc/frr (the package defaults unless someone edited them)."""
    if not os.path.exists("/etc/frr/daemons"):
        raise RuntimeError("/etc/frr/daemons missing: is frr installed? (ensure_packages())")
    return "/etc/frr"


# -- karios demo --fabric ---------------------------------------------------------------
# What the demo does with a started lab: the worker's settings, adoption of the three nodes
# through the gateway with their SSH key, and the stored fabric configuration (docs/cli.md).

DEMO_PREFIX = "kd"  # namespaces kd-<pid>-<seq>-node1…, fabric; leftovers of a dead demo are removed
DEMO_NODES = 3
DEMO_ASN = 65000
DEMO_VNIS = (100, 200)
DEMO_LAB_FILE = "fabric-lab.json"  # in the demo's state dir: what the lab created (tests read it)


def demo_unavailable() -> str | None:
    """Why ``karios demo --fabric`` cannot run on this machine (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (it creates network namespaces, veths and a bridge); run it with sudo"
    reason = skip_reason()
    if reason:
        return reason
    missing = missing_packages()
    if missing:
        return f"missing Debian packages: apt-get install {' '.join(missing)}"
    return None


def demo_lab() -> FabricLab:
    """The demo's lab: 3 nodes + route reflector, a host link (the services reach the nodes from
    the root namespace), packages never installed behind the user's back (demo_unavailable)."""
    return FabricLab(n_nodes=DEMO_NODES, prefix=DEMO_PREFIX, install=False, host_link_lock_timeout=60.0)


def demo_worker_env() -> dict[str, str]:
    """The fabric worker's settings in the demo: the L2 VNIs every node gets, and FRR's log in the
    node's own /run/frr (a per-node bind mount: nothing is written to the host's /var/log/frr)."""
    return {
        "KARIOS_FABRIC_VNIS": ",".join(str(v) for v in DEMO_VNIS),
        "KARIOS_FABRIC_FRR_LOG_FILE": "/run/frr/frr.log",
    }


def demo_fabric_config() -> dict[str, object]:
    """The fabric configuration stored for the demo's nodes: iBGP (AS 65000) to the lab's route
    reflector as the "switch" (NOS ``other``: no switch snippet to acknowledge), no OSPF, VXLAN MTU
    9000 (the lab's bridge MTU), router ids from 198.19.1.0/24."""
    return {
        "as": DEMO_ASN,
        "fabric_switch_as": DEMO_ASN,
        "fabric_switch_name": "rr",
        "fabric_switch_nos": "other",
        "fabric_switch_peering_ip": FABRIC_IP,
        "fabric_switch_role": "spine",
        "management_cidr": f"198.18.0.0/{UNDERLAY_PREFIX}",
        "router_id_cidr": "198.19.1.1/24",
        "vxlan_mtu": 9000,
        "ospf_enabled": False,
        "expected_nodes": DEMO_NODES,
        "skip_switch_ack": True,
    }


def _api(gateway: str, token: str, method: str, path: str, body: object = None) -> tuple[int, dict]:
    """One JSON call to the gateway (our own 127.0.0.1 URL): (status, body)."""
    req = urllib.request.Request(  # noqa: S310 (the demo's own gateway URL)
        gateway + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        data = {"message": raw.decode(errors="replace")[:300]}
    return status, data if isinstance(data, dict) else {"items": data}


def adopt_and_configure(lab: FabricLab, gateway: str, token: str) -> list[dict]:
    """Adopt every lab node through the gateway (``POST /controlnode/nodes`` with the lab's SSH
    key: the worker pins each host key on first contact) and store :func:`demo_fabric_config`.
    Returns the adopted nodes as the gateway answered them (no secrets). A refusal raises
    RuntimeError with the gateway's message; a pinned fingerprint other than the node's own key
    (someone else answered on that address) too."""
    with open(lab.client_key_path) as fh:
        key = fh.read()
    adopted = []
    for n in lab.nodes:
        body = {
            "node_ip": n.underlay_ip,
            "ssh_username": n.username,
            "ssh_private_key": key,
            "ssh_port": n.ssh_port,
            "hostname": n.name,
        }
        status, answer = _api(gateway, token, "POST", "/controlnode/nodes", body)
        if status != 201:
            raise RuntimeError(f"adopting {n.name} ({n.underlay_ip}): HTTP {status}: {answer.get('message')}")
        if answer.get("host_key_fingerprint") != n.host_key_fingerprint:
            raise RuntimeError(
                f"adopting {n.name} ({n.underlay_ip}): pinned host key {answer.get('host_key_fingerprint')} "
                f"is not the node's ({n.host_key_fingerprint})"
            )
        adopted.append(answer)
    status, answer = _api(gateway, token, "POST", "/controlnode/fabric-config", demo_fabric_config())
    if status not in (200, 201):
        raise RuntimeError(f"storing the fabric configuration: HTTP {status}: {answer.get('message')}")
    return adopted


def describe(lab: FabricLab) -> dict[str, object]:
    """What the lab created (namespaces, the root-namespace link, the route reflector's run dir):
    written to the demo's state dir for whoever checks or cleans up after it. No secrets."""
    return {
        "run_id": lab.run_id,
        "namespaces": [lab.fabric_netns, *(n.netns for n in lab.nodes)],
        "host_link": lab.host_ifname if lab.host_link else "",
        "workdir": lab.workdir,
        "route_reflector": {"ip": FABRIC_IP, "asn": DEMO_ASN, "run_frr_dir": lab.rr_run_frr_dir},
        "nodes": [
            {
                "name": n.name,
                "netns": n.netns,
                "underlay_ip": n.underlay_ip,
                "loopback_ip": n.loopback_ip,
                "host_key_fingerprint": n.host_key_fingerprint,
                "sshd_pid": n.sshd_pid,
            }
            for n in lab.nodes
        ],
    }
