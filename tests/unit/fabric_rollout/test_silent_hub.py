"""A hub that lost a node's dynamic peer (issue 23, the matrix's old retries): the rule that tells
it from a slow or empty fabric, on FRR 8.4 output recorded in the lab at the fault
(``evpn_summary_node1_silent_hub.json``: node1's session Established 7 s, 1 route sent, none
received; ``evpn_summary_hub_lost_node1.json``: the hub at that moment lists only node2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from karios.fabric_worker.rollout.overlay import (
    SILENT_HUB_AFTER_S,
    OverlayView,
    Session,
    hub_reset_command,
    parse_overlay,
    parse_sessions,
    silent_hub,
)

FIXTURES = Path(__file__).parent / "fixtures"
HUB = "198.18.0.1"
MISSING = {100: {"10.255.0.2"}}


def _view(sessions: dict[str, Session]) -> OverlayView:
    return OverlayView(None, None, (), {}, {}, sessions)


def test_the_recorded_fault_is_a_silent_hub() -> None:
    sessions = parse_sessions(json.loads((FIXTURES / "evpn_summary_node1_silent_hub.json").read_text()))
    assert sessions == {HUB: Session("Established", 7.0, 0, 1)}
    why = silent_hub(_view(sessions), HUB, MISSING)
    assert why is not None
    assert why.startswith(f"the session to {HUB} was Established 7 s with 1 route(s) sent and none received")
    assert "10.255.0.2" in why and "session reset" in why
    # the hub's own view at that moment: node1 is not among its peers
    hub = parse_sessions(json.loads((FIXTURES / "evpn_summary_hub_lost_node1.json").read_text()))
    assert set(hub) == {"198.18.0.12"}


def test_a_healthy_slow_or_empty_fabric_is_never_reset() -> None:
    silent = Session("Established", SILENT_HUB_AFTER_S + 1, 0, 1)
    assert silent_hub(_view({HUB: silent}), HUB, MISSING) is not None
    cases = {
        "young session": dataclasses.replace(silent, up_s=SILENT_HUB_AFTER_S - 0.5),
        "routes received": dataclasses.replace(silent, pfx_rcd=1),
        "nothing advertised yet": dataclasses.replace(silent, pfx_snt=0),
        "not established": Session("Active", 0.0, 0, 0),
    }
    for what, session in cases.items():
        assert silent_hub(_view({HUB: session}), HUB, MISSING) is None, what
    assert silent_hub(_view({HUB: silent}), HUB, {}) is None, "no route missing: nothing to repair"
    assert silent_hub(_view({"198.18.0.9": silent}), HUB, MISSING) is None, "another peer's session"
    assert silent_hub(_view({}), HUB, MISSING) is None, "no session read"


def test_sessions_parse_from_the_overlay_poll_line_and_tolerate_junk() -> None:
    summary = (FIXTURES / "evpn_summary_node1_silent_hub.json").read_text().replace("\n", "")
    view = parse_overlay("{}{}{}" + summary + "\t[]")
    assert view.sessions[HUB].pfx_snt == 1
    assert parse_overlay("{}{}{}\t[]").sessions == {}  # an FRR that printed three documents
    assert parse_sessions({"peers": {HUB: {"state": "Established", "pfxRcd": "x"}}}) == {}
    assert parse_sessions({"peers": []}) == {} and parse_sessions(None) == {}
    assert parse_sessions({"peers": {HUB: {"state": "Connect", "peerUptimeMsec": 9000}}})[HUB].up_s == 0.0


def test_the_reset_is_a_hard_clear_of_that_one_session() -> None:
    assert hub_reset_command(HUB) == f"vtysh -c 'clear bgp {HUB}'"
