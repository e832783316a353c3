"""What ``karios demo --fabric`` builds and stores: the demo's lab (3 nodes + route reflector), the
fabric worker's settings, the fabric configuration stored for the nodes, and the description of
the lab written to the demo's state dir (docs/cli.md). Stdlib only."""

from __future__ import annotations

import os

from karios.cli.demo.lab import FabricLab
from karios.cli.demo.packages import missing_packages, skip_reason
from karios.cli.demo.topology import FABRIC_IP, UNDERLAY_PREFIX

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
