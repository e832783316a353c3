"""The intent of the fabric lab the unit tests' fixtures were recorded on (3 nodes, RR 198.18.0.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from karios.fabric_worker.rollout.intent import FabricIntent

LAB_INTENT: dict[str, Any] = {
    "asn": 65000,
    "peer_ip": "198.18.0.1",
    "router_id_base": "198.19.1.1",
    "router_id_prefix_len": 24,
    "underlay_cidr": "198.18.0.0/24",
    "vxlan_mtu": 9000,
    "vnis": [100],
}


def lab_intent(**overrides: Any) -> FabricIntent:
    """The lab's intent, with ``overrides`` (an OSPF underlay, a password, other VNIs …)."""
    return FabricIntent(**(LAB_INTENT | overrides))


OVERLAY_FIXTURES = Path(__file__).parent / "fixtures" / "overlay"


def overlay_line(name: str = "overlay_node2") -> str:
    """One recorded poll line of the post-deploy overlay loop (FRR 8.4, VNIs 100 and 200,
    VTEPs 198.19.1.1-3): `name` is a file of fixtures/overlay/ without ``.txt``."""
    return (OVERLAY_FIXTURES / f"{name}.txt").read_text().strip()


def discovery_overlay_section() -> str:
    """The overlay section of node2's recorded apply discovery (the vtysh documents, one line)."""
    text = (OVERLAY_FIXTURES / "discover_node2.txt").read_text()
    return text.split("@@karios:overlay\n", 1)[1].split("\n", 1)[0]
