"""The fabric lab's network: namespaces, veths, the fabric bridge and the optional host link
(:class:`LabNetwork`), and the teardown of a namespace with whatever runs in it. Stdlib only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence

from karios.cli.demo.host import acquire_lock, run_checked
from karios.cli.demo.topology import FABRIC_IP, HOST_IP, UNDERLAY_PREFIX, LabNode


class LabNetwork:
    """Builds the lab's links: the fabric namespace's bridge ``br0`` with one veth per node, each
    node's ``br-underlay`` and loopback, and (``host_link``) a veth from the root namespace into the
    bridge. The host link is serialised machine-wide by a lock file held until :meth:`release`."""

    def __init__(self, fabric_netns: str, host_ifname: str) -> None:
        self.fabric_netns = fabric_netns
        self.host_ifname = host_ifname
        self._host_lock_fd: int | None = None

    def build(
        self, nodes: Sequence[LabNode], fabric_mtu: int, *, host_link: bool, lock_timeout: float
    ) -> None:
        fab = self.fabric_netns
        for ns in [fab] + [n.netns for n in nodes]:
            run_checked(["ip", "netns", "add", ns])
        lines = [
            "link set lo up",
            f"link add br0 mtu {fabric_mtu} type bridge forward_delay 0 stp_state 0",
            f"addr add {FABRIC_IP}/{UNDERLAY_PREFIX} dev br0",
            "link set br0 up",
        ]
        for n in nodes:
            # Fabric side stays at the fabric MTU; the node side carries the drift.
            lines += [
                f"link add vn{n.index} mtu {fabric_mtu} type veth peer name eth0 mtu {n.mtu} netns {n.netns}",
                f"link set vn{n.index} master br0",
                f"link set vn{n.index} up",
            ]
        # A bridge follows its smallest port's MTU until its own MTU is set explicitly.
        lines.append(f"link set br0 mtu {fabric_mtu}")
        ip_batch(fab, lines)
        for n in nodes:
            ip_batch(
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
        for n in nodes:
            wait_carrier(n.netns, "br-underlay")
        if host_link:
            self._add_host_link(fabric_mtu, lock_timeout)

    def _add_host_link(self, mtu: int, lock_timeout: float) -> None:
        self._host_lock_fd = acquire_lock("host-link.lock", lock_timeout)
        _remove_stale_host_links()
        veth = ["type", "veth", "peer", "name", "host", "mtu", str(mtu), "netns", self.fabric_netns]
        run_checked(["ip", "link", "add", self.host_ifname, "mtu", str(mtu), *veth])
        ip_batch(
            self.fabric_netns, ["link set host master br0", "link set host up", f"link set br0 mtu {mtu}"]
        )
        run_checked(["ip", "addr", "add", f"{HOST_IP}/{UNDERLAY_PREFIX}", "dev", self.host_ifname])
        run_checked(["ip", "link", "set", self.host_ifname, "up"])

    def remove_host_link(self) -> None:
        # Delete the host end explicitly: a namespace can outlive `ip netns del` for minutes
        # (lingering sockets), and its veth would keep routing the lab subnet in the root ns.
        subprocess.run(["ip", "link", "del", self.host_ifname], capture_output=True, check=False)

    def release(self) -> None:
        """Let the next lab add its host link."""
        if self._host_lock_fd is not None:
            os.close(self._host_lock_fd)
            self._host_lock_fd = None


def _remove_stale_host_links() -> None:
    """Delete root-namespace links still holding the host address (left by a lab whose namespace
    lingers after deletion); called with the host-link lock held, so none of them is live."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "to", f"{HOST_IP}/32"], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        name = line.split()[1].split("@")[0]
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


def list_netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def destroy_netns(ns: str) -> None:
    """Kill every process in netns `ns` (never by name: the PID space is shared), delete it."""
    if ns not in list_netns():
        return
    pids = netns_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = netns_pids(ns)
    # Whatever ignored SIGTERM (or was respawned by watchfrr meanwhile) gets SIGKILL.
    for _ in range(50):
        pids = netns_pids(ns)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def ip_batch(ns: str, lines: list[str]) -> None:
    res = subprocess.run(
        ["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True, text=True
    )
    if res.returncode != 0:
        raise RuntimeError(f"ip -n {ns} -batch failed: {res.stderr.strip()}\n" + "\n".join(lines))


def wait_carrier(ns: str, ifname: str, timeout: float = 5.0) -> None:
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
