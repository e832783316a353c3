"""The intent of the fabric lab the unit tests' fixtures were recorded on (3 nodes, RR 198.18.0.1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from karios.fabric_worker.rollout.intent import FabricIntent
from karios.fabric_worker.rollout.verify import VERIFY_NO_SESSION

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


def with_summary(line: str, summary: str) -> str:
    """An overlay poll line with `summary` as its EVPN summary (the 4th vtysh document) when it
    has none: the recordings predate that document. A line with one, or whose vtysh printed
    fewer than three documents (FRR stopped), is returned as it is."""
    vtysh, tab, links = line.partition("\t")
    dec, docs, i = json.JSONDecoder(), 0, 0
    while i < len(vtysh):
        try:
            _, i = dec.raw_decode(vtysh, i)
        except json.JSONDecodeError:
            break
        docs += 1
    if docs != 3 or i != len(vtysh):
        return line
    return vtysh + summary.replace("\n", "") + tab + links


def merged_polls(command: str, polls: list[str], overlay: list[str]) -> list[str] | None:
    """What the apply's one verify-and-overlay loop prints in a fake session (None: `command` is
    not that loop): a look per verify poll but the last, then the overlay lines, each carrying
    the last verify poll's summary where it has none."""
    if "/proc/net/tcp" not in command or "show evpn vni json" not in command:
        return None
    if polls and polls[-1] == VERIFY_NO_SESSION:  # never a session: nothing but the gate's lines
        return polls
    out = (
        [p if p == VERIFY_NO_SESSION else with_summary(overlay[0], p) for p in polls[:-1]] if overlay else []
    )
    return out + [with_summary(line, polls[-1]) if polls else line for line in overlay]
