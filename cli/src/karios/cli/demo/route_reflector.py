"""The fabric lab's route reflector (:class:`RouteReflector`): FRR in the fabric namespace, with
its own /etc/frr and /run/frr bind-mounted in a private mount namespace; iBGP AS 65000 with a
listen range over the underlay, so every node that peers becomes a client. Stdlib only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from karios.cli.demo.host import chown_frr, make_frr_dirs, pid_alive, read_pid
from karios.cli.demo.topology import FABRIC_IP, UNDERLAY_PREFIX


class RouteReflector:
    """One FRR instance in ``netns``; its dirs exist after :meth:`prepare`, its daemons after
    :meth:`start`. Commands run through ``nsenter`` into the namespaces of its zebra."""

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self.etc_frr_dir = ""
        self.run_frr_dir = ""

    def prepare(self, workdir: str) -> None:
        """Its /etc/frr (the package defaults) and /run/frr under ``workdir``/rr."""
        rdir = os.path.join(workdir, "rr")
        os.makedirs(rdir)
        self.etc_frr_dir = os.path.join(rdir, "etc-frr")
        self.run_frr_dir = os.path.join(rdir, "run-frr")
        make_frr_dirs(self.etc_frr_dir, self.run_frr_dir, seed=True)

    def start(
        self, config: str | None, daemons: tuple[str, ...], *, loaded: str = "bgp listen range"
    ) -> None:
        """Start FRR with ``daemons`` and ``config`` (default: the lab's own route reflector) and
        wait until the config is loaded: its running config shows ``loaded`` (a route
        reflector's ``bgp listen range``; a switch without BGP: e.g. ``router ospf``)."""
        with open(os.path.join(self.etc_frr_dir, "daemons"), "a") as fh:
            fh.write("\n# karios lab route reflector\n" + "".join(f"{d}=yes\n" for d in daemons))
        conf = os.path.join(self.etc_frr_dir, "frr.conf")
        with open(conf, "w") as fh:
            fh.write(config or _RR_CONFIG.format(fabric_ip=FABRIC_IP, prefix=UNDERLAY_PREFIX))
        chown_frr(conf)
        log = os.path.join(os.path.dirname(self.etc_frr_dir), "frrinit.log")
        script = (
            'set -e; mount --bind "$1" /etc/frr; mount --bind "$2" /run/frr; '
            "exec /usr/lib/frr/frrinit.sh start"
        )
        dirs = [self.etc_frr_dir, self.run_frr_dir]
        with open(log, "wb") as fh:
            res = subprocess.run(
                ["ip", "netns", "exec", self.netns, "unshare", "-m", "--", "sh", "-c", script, "sh", *dirs],
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
                if loaded in self.vtysh("show running-config", timeout=5):
                    return
            if time.monotonic() > deadline:
                with open(log) as fh:
                    raise RuntimeError(f"route reflector config not loaded:\n{fh.read()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop its daemons and wait until none is left (the lab reuses the namespace for another
        configuration: a daemon still running would serve the old one beside the new)."""
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._nsenter(["/usr/lib/frr/frrinit.sh", "stop"], 30)
        run = self.run_frr_dir
        names = [f for f in os.listdir(run) if f.endswith(".pid")] if run and os.path.isdir(run) else []
        pids = [p for p in (read_pid(os.path.join(run, f)) for f in names) if p]
        deadline = time.monotonic() + 5
        for pid in pids:
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def vtysh(self, cmd: str, *, timeout: float = 30.0) -> str:
        """Run one vtysh command; return its output."""
        res = self._nsenter(["vtysh", "-c", cmd], timeout)
        if res.returncode != 0:
            raise RuntimeError(f"rr vtysh {cmd!r} failed ({res.returncode}): {res.stdout}{res.stderr}")
        return res.stdout

    def paste(self, text: str, *, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Paste `text` as an operator would: `configure terminal`, then each line in one vtysh
        session (the context of `router bgp` carries over lines)."""
        argv = ["vtysh", "-c", "configure terminal"]
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("!"):
                argv += ["-c", line.strip()]
        return self._nsenter(argv, timeout)

    def shell(self, command: str, *, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a shell command (e.g. a snippet's verify command) in its namespaces."""
        return self._nsenter(["sh", "-c", command], timeout)

    def _pid(self) -> int:
        pid = read_pid(os.path.join(self.run_frr_dir, "zebra.pid"))
        if not pid:
            raise RuntimeError("route reflector is not running")
        return pid

    def _nsenter(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["nsenter", "-t", str(self._pid()), "-m", "-n", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


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
