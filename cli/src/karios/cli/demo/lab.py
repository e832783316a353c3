"""The fabric lab (:class:`FabricLab`): compute nodes as network namespaces running real OpenSSH
(and FRR once a fabric is applied) plus an FRR route reflector, on this machine (root only), and a
stop that removes all of it. ``karios demo --fabric`` runs it (:mod:`karios.cli.demo.config`); the
tests use it too, through ``tests/lab/fabric_lab.py`` (see tests/lab/README.md).

The lab orchestrates its collaborators: :class:`~karios.cli.demo.netns.LabNetwork` (namespaces
and links), :class:`~karios.cli.demo.nodes.LabNodes` (keys, sshd per node, access) and
:class:`~karios.cli.demo.route_reflector.RouteReflector`. Stdlib only (the lab self-test runs it
with a bare ``python3``). Addresses: only 198.18.0.0/15 (RFC 2544 benchmarking space).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence

from karios.cli.demo.host import pid_alive, raise_neighbour_tables
from karios.cli.demo.netns import LabNetwork, destroy_netns, list_netns
from karios.cli.demo.nodes import LabNodes
from karios.cli.demo.packages import ensure_packages
from karios.cli.demo.route_reflector import RouteReflector
from karios.cli.demo.topology import MAX_NODES, LabNode

_ACTIVE_RUNS: set[str] = set()  # run ids of labs alive in this process
_SEQ = iter(range(1_000_000))


def _owned(collaborator: str, name: str, doc: str) -> property:
    """A read-only attribute of the lab that one of its collaborators owns."""
    return property(lambda lab: getattr(getattr(lab, collaborator), name), doc=doc)


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
        self.timings: dict[str, float] = {}
        self.network = LabNetwork(self.fabric_netns, self.host_ifname)
        self.lab_nodes = LabNodes(self.run_id)
        self.rr = RouteReflector(self.fabric_netns)
        self._started = False

    # -- what the collaborators made (read-only) ------------------------------------------

    nodes = _owned("lab_nodes", "nodes", "Every node (list of LabNode), node1 first.")
    client_key_path = _owned("lab_nodes", "client_key_path", "The SSH private key every node accepts.")
    client_public_key = _owned("lab_nodes", "client_public_key", "Its public key (one line).")
    known_hosts_path = _owned("lab_nodes", "known_hosts_path", "known_hosts with every node's host key.")
    rr_etc_frr_dir = _owned("rr", "etc_frr_dir", "The route reflector's /etc/frr (a host path).")
    rr_run_frr_dir = _owned("rr", "run_frr_dir", "The route reflector's /run/frr (a host path).")

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
            raise_neighbour_tables(self.n_nodes)
            self.network.build(
                self.nodes,
                self.fabric_mtu,
                host_link=self.host_link,
                lock_timeout=self.host_link_lock_timeout,
            )
            self.timings["network"] = time.monotonic() - t
            t = time.monotonic()
            self.lab_nodes.start_sshds()
            self.timings["sshd"] = time.monotonic() - t
            if self.with_rr:
                t = time.monotonic()
                self.rr.start(self.rr_config, self.rr_daemons)
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
            self.network.remove_host_link()
        namespaces = [n.netns for n in self.nodes] + [self.fabric_netns]
        namespaces += [ns for ns in list_netns() if ns.startswith(self.run_id + "-")]
        for ns in dict.fromkeys(namespaces):
            destroy_netns(ns)
        self.lab_nodes.kill()
        self.network.release()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        _ACTIVE_RUNS.discard(self.run_id)
        self.timings["stop"] = time.monotonic() - t

    def _make_workdir(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix=f"karios-fabric-{self.run_id}-")
        os.chmod(self.workdir, 0o755)  # noqa: S103 (sshd reads authorized_keys here; the key is 0600)
        self.lab_nodes.prepare(self.workdir, self.n_nodes, self._mtu_for, seed=self.seed_frr_etc)
        if self.with_rr:
            self.rr.prepare(self.workdir)

    def _mtu_for(self, index: int, name: str) -> int:
        for key in (name, index, str(index)):
            if key in self.mtu_overrides:
                return int(self.mtu_overrides[key])
        return self.fabric_mtu

    # -- access ------------------------------------------------------------------------

    def node(self, ref: LabNode | str | int) -> LabNode:
        """A node by LabNode, name ("node2"), netns name or 1-based index."""
        return self.lab_nodes.node(ref)

    def ssh_argv(self, node: LabNode | str | int, *command: str) -> list[str]:
        """`ssh` argv reaching `node` from the host (needs host_link) with the lab key."""
        return self.lab_nodes.ssh_argv(node, *command)

    def node_exec(
        self, node: LabNode | str | int, cmd: str | Sequence[str], **kw
    ) -> subprocess.CompletedProcess:
        """Run `cmd` inside the node (its netns, mount ns with /etc/frr, hostname); keywords
        ``check``, ``timeout``, ``input``: :meth:`karios.cli.demo.nodes.LabNodes.node_exec`."""
        return self.lab_nodes.node_exec(node, cmd, **kw)

    def node_pids(self, node: LabNode | str | int) -> list[int]:
        """PIDs of every process in the node's network namespace (sshd included)."""
        return self.lab_nodes.node_pids(node)

    def rr_vtysh(self, cmd: str, *, timeout: float = 30.0) -> str:
        """Run one vtysh command on the route reflector; return its output."""
        if not self.with_rr:
            raise RuntimeError("lab started with with_rr=False")
        return self.rr.vtysh(cmd, timeout=timeout)

    def rr_paste(self, text: str, *, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Paste `text` on the route reflector as an operator would (one vtysh session)."""
        return self.rr.paste(text, timeout=timeout)

    def rr_shell(self, command: str, *, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a shell command (e.g. a snippet's verify command) on the route reflector."""
        return self.rr.shell(command, timeout=timeout)

    def rr_vtysh_json(self, cmd: str, *, timeout: float = 30.0):
        """Run a `... json` vtysh command on the route reflector; return parsed JSON."""
        return json.loads(self.rr_vtysh(cmd, timeout=timeout) or "{}")

    def rr_evpn_peer_states(self) -> dict[str, str]:
        """{peer address: BGP state} of the RR's l2vpn evpn sessions."""
        data = self.rr_vtysh_json("show bgp l2vpn evpn summary json")
        return {ip: p.get("state", "") for ip, p in data.get("peers", {}).items()}


# -- leftovers -------------------------------------------------------------------------


def cleanup_leftovers(prefix: str = "kl") -> list[str]:
    """Remove namespaces and workdirs of labs with `prefix` whose owner process is gone.

    Labs of live processes (parallel pytest workers) are left alone. Returns the removed
    namespace names.
    """
    removed = []
    pat = re.compile(rf"^{re.escape(prefix)}-(\d+)-(\d+)-")
    for ns in list_netns():
        m = pat.match(ns)
        if m and _run_is_dead(prefix, m):
            destroy_netns(ns)
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
    return not pid_alive(pid)
