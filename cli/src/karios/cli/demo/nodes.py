"""The fabric lab's compute nodes (:class:`LabNodes`): their SSH keys and per-node directories in
the lab's workdir, one OpenSSH daemon per node in its namespaces, and the ways in (``ssh`` from
the host, ``nsenter`` into the node). Stdlib only."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence

from karios.cli.demo.host import keygen, make_frr_dirs, read_pid
from karios.cli.demo.netns import netns_pids
from karios.cli.demo.topology import LabNode, loopback_ip, underlay_ip


class LabNodes:
    """Every node of one lab and the sshd processes serving them (``nodeN`` in ``<run_id>-nodeN``).

    Each sshd runs in the node's own network and UTS namespace (hostname ``nodeN``) and a mount
    namespace where the node's dirs are bind-mounted on /etc/frr, /run/frr and /root."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.nodes: list[LabNode] = []
        self.client_key_path = ""
        self.client_public_key = ""
        self.known_hosts_path = ""
        self.authorized_keys_path = ""
        self.procs: list[subprocess.Popen] = []

    def prepare(self, workdir: str, n_nodes: int, mtu_for: Callable[[int, str], int], *, seed: bool) -> None:
        """The lab's client key, and per node: host key, /etc/frr (``seed``: the package
        defaults), /run/frr and /root dirs; the known_hosts file with every node's host key."""
        self.client_key_path = os.path.join(workdir, "id_ed25519")
        keygen(self.client_key_path, "karios-lab-client")
        with open(self.client_key_path + ".pub") as fh:
            self.client_public_key = fh.read().strip()
        self.authorized_keys_path = os.path.join(workdir, "authorized_keys")
        with open(self.authorized_keys_path, "w") as fh:
            fh.write(self.client_public_key + "\n")
        self.known_hosts_path = os.path.join(workdir, "known_hosts")
        known = []
        for i in range(1, n_nodes + 1):
            name = f"node{i}"
            ndir = os.path.join(workdir, name)
            os.makedirs(ndir)
            etc, run = os.path.join(ndir, "etc-frr"), os.path.join(ndir, "run-frr")
            make_frr_dirs(etc, run, seed=seed)
            make_node_home(os.path.join(ndir, "root-home"))
            hostkey = os.path.join(ndir, "ssh_host_ed25519_key")
            keygen(hostkey, f"root@{name}")
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
                    mtu=mtu_for(i, name),
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

    def start_sshds(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        os.makedirs("/run/frr", exist_ok=True)  # mount point only
        os.makedirs("/etc/frr", exist_ok=True)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        for n in self.nodes:
            proc = self._spawn_sshd(n, sshd)
            self.procs.append(proc)
            n.sshd_pid = proc.pid
        deadline = time.monotonic() + 15
        for n, proc in zip(self.nodes, self.procs, strict=True):
            pidfile = os.path.join(os.path.dirname(n.etc_frr_dir), "sshd.pid")
            while read_pid(pidfile) != proc.pid:
                if proc.poll() is not None or time.monotonic() > deadline:
                    with open(os.path.join(os.path.dirname(pidfile), "sshd.log")) as fh:
                        raise RuntimeError(f"sshd on {n.name} did not start:\n{fh.read()}")
                time.sleep(0.01)

    def _spawn_sshd(self, n: LabNode, sshd: str) -> subprocess.Popen:
        ndir = os.path.dirname(n.etc_frr_dir)
        cfg = os.path.join(ndir, "sshd_config")
        with open(cfg, "w") as fh:
            fh.write(
                _SSHD_CONFIG.format(
                    ip=n.underlay_ip, port=n.ssh_port, dir=ndir, authorized_keys=self.authorized_keys_path
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
        args = [n.name, n.etc_frr_dir, n.run_frr_dir, sshd, cfg, os.path.join(ndir, "root-home")]
        with open(os.path.join(ndir, "sshd.log"), "wb") as log:
            return subprocess.Popen(
                ["ip", "netns", "exec", n.netns, "unshare", "--uts", "--", "sh", "-c", script, "sh", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def kill(self) -> None:
        """Kill the sshd processes this lab started (what is left after its namespaces went)."""
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()

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
        return netns_pids(self.node(node).netns)


def make_node_home(path: str) -> None:
    """A node's /root as Debian creates it (base-files' dot.bashrc/dot.profile, else empty)."""
    os.makedirs(path, mode=0o700)
    for name in ("bashrc", "profile"):
        src = f"/usr/share/base-files/dot.{name}"
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(path, f".{name}"))


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
