"""The intent of the fabric lab the unit tests' fixtures were recorded on (3 nodes, RR 198.18.0.1)."""

from __future__ import annotations

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
