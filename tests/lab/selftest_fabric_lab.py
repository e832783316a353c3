"""Self-test of the fabric lab: `python3 tests/lab/selftest_fabric_lab.py` as root.

Brings up 2 nodes and the route reflector, SSHes in from the host with plain `ssh`,
configures and starts FRR on node1 over SSH the way an operator would, waits for the
EVPN session to the RR, then tears down and checks nothing is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The repository root, for the one wait helper (stdlib only) when run as a script.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import fabric_lab

from tests.fixtures.wait import wait_until_sync

ESTABLISHED_DEADLINE_S = 30.0

NODE_DAEMONS = """\
bgpd=yes
vtysh_enable=yes
zebra_options=" -A 127.0.0.1 -s 90000000"
bgpd_options="  -A 127.0.0.1"
staticd_options="-A 127.0.0.1"
"""

NODE_FRR_CONF = """\
frr defaults traditional
hostname {name}
log file /run/frr/frr.log informational
service integrated-vtysh-config
!
router bgp 65000
 bgp router-id {loopback}
 no bgp default ipv4-unicast
 neighbor {rr} remote-as 65000
 neighbor {rr} timers 3 9
 neighbor {rr} timers connect 1
 !
 address-family l2vpn evpn
  neighbor {rr} activate
  advertise-all-vni
 exit-address-family
exit
!
"""


def step(label: str, t0: float) -> float:
    now = time.monotonic()
    print(f"  {label:<48} {now - t0:7.3f} s", flush=True)
    return now


def ssh(lab: fabric_lab.FabricLab, node, command: str, input: str | None = None) -> str:
    res = subprocess.run(lab.ssh_argv(node, command), capture_output=True, text=True, input=input, timeout=30)
    if res.returncode != 0:
        raise AssertionError(f"ssh {command!r} -> {res.returncode}: {res.stderr}")
    return res.stdout


def read_text(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def root_ssh_state() -> tuple:
    try:
        st = os.stat("/root/.ssh")
    except FileNotFoundError:
        return ("absent",)
    files = sorted(os.listdir("/root/.ssh"))
    return (st.st_mtime_ns, tuple((f, os.stat(os.path.join("/root/.ssh", f)).st_mtime_ns) for f in files))


def main() -> int:
    reason = fabric_lab.skip_reason()
    if reason:
        print(f"SKIPPED: {reason}")
        return 0
    print("fabric lab self-test")
    t = t_all = time.monotonic()
    installed = fabric_lab.ensure_packages()
    t = step(f"ensure_packages (installed {installed or 'nothing'})", t)

    root_ssh_before = root_ssh_state()
    host_daemons_before = read_text("/etc/frr/daemons")

    lab = fabric_lab.FabricLab(n_nodes=2, mtu_overrides={"node2": 1500})
    with lab:
        t = step("lab up (2 nodes + RR, host link)", t)
        print("    lab timings:", {k: round(v, 3) for k, v in lab.timings.items()})

        for node in lab.nodes:
            out = ssh(lab, node, "hostname").strip()
            assert out == node.name, (out, node.name)
        t = step("ssh root@node hostname, both nodes", t)

        mtu2 = lab.node_exec("node2", "cat /sys/class/net/br-underlay/mtu").stdout.strip()
        mtu1 = lab.node_exec("node1", "cat /sys/class/net/br-underlay/mtu").stdout.strip()
        assert (mtu1, mtu2) == ("9000", "1500"), (mtu1, mtu2)
        assert ssh(lab, 1, "ls -A /etc/frr").strip() == "", "node /etc/frr must start empty"
        assert lab.node_exec(1, "test -e /run/frr/zebra.pid").returncode != 0

        n1 = lab.node(1)
        ssh(lab, n1, "cat > /etc/frr/daemons", input=NODE_DAEMONS)
        ssh(lab, n1, "cat > /etc/frr/vtysh.conf", input="service integrated-vtysh-config\n")
        ssh(
            lab,
            n1,
            "cat > /etc/frr/frr.conf",
            input=NODE_FRR_CONF.format(name=n1.name, loopback=n1.loopback_ip, rr=fabric_lab.FABRIC_IP),
        )
        ssh(lab, n1, "chown -R frr:frr /etc/frr && /usr/lib/frr/frrinit.sh start >/dev/null")
        t = step("FRR configured + started on node1 over ssh", t)

        def rr_session_state() -> str:
            out = ssh(lab, n1, "vtysh -c 'show bgp l2vpn evpn summary json'")
            peers = json.loads(out or "{}").get("peers", {})
            return str(peers.get(fabric_lab.FABRIC_IP, {}).get("state", ""))

        state = wait_until_sync(
            lambda: (s := rr_session_state()) == "Established" and s,
            timeout=ESTABLISHED_DEADLINE_S,
            interval=0.2,
            what="node1's EVPN session to the RR",
        )
        assert state == "Established", f"EVPN session to RR: {state!r}"
        t = step("node1 EVPN session to RR Established", t)
        rr_states = lab.rr_evpn_peer_states()
        assert rr_states.get(n1.underlay_ip) == "Established", rr_states

        # Isolation: node2 and the host's /etc/frr are untouched, node2 runs no FRR.
        assert ssh(lab, 2, "ls -A /etc/frr").strip() == ""
        assert read_text("/etc/frr/daemons") == host_daemons_before
        frr_pids = [
            fabric_lab._read_pid(os.path.join(n1.run_frr_dir, f"{d}.pid"))
            for d in ("watchfrr", "zebra", "bgpd", "staticd")
        ]
        assert all(frr_pids), frr_pids
        assert set(frr_pids) <= set(lab.node_pids(1))
        assert not set(frr_pids) & set(lab.node_pids(2))
        sshd_pids = [n.sshd_pid for n in lab.nodes]
        rr_pids = fabric_lab._netns_pids(lab.fabric_netns)
        assert rr_pids, "route reflector runs in the fabric namespace"
        workdir, run_id = lab.workdir, lab.run_id

    t = step("teardown", t)
    leftovers = [ns for ns in fabric_lab._list_netns() if ns.startswith(run_id)]
    assert not leftovers, leftovers
    alive = [p for p in frr_pids + sshd_pids + rr_pids if _running(p)]
    assert not alive, f"processes left running: {alive}"
    assert not os.path.exists(workdir), workdir
    assert root_ssh_state() == root_ssh_before, "/root/.ssh was modified"
    print(f"  {'total':<48} {time.monotonic() - t_all:7.3f} s")
    print("fabric lab self-test: OK")
    return 0


def _running(pid: int) -> bool:
    """Alive and not a zombie (zombies wait for PID 1 to reap them)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
