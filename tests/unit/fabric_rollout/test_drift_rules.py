"""Drift without false alarms (pure, issue 23 item 8): a missing VTEP is named on the node it
belongs to, a BGP neighbor shut by hand is named as such, and what a settling fabric shows is
held back (settle window after an apply; VTEP findings need two rounds in a row)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

from karios.common.contracts.fabric_rollout import DriftFinding
from karios.fabric_worker.rollout.drift import NodeDrift, bgp_admin_shutdown, judge_drift
from karios.fabric_worker.rollout.drift_rules import (
    Settle,
    attribute,
    held_rows,
    hold,
    last_check,
    settled,
)
from tests.unit.fabric_rollout.test_drift import INTENT, VTEP, _summary, _synced

VTEPS = {"n1": "198.19.1.2", "n2": "198.19.1.3", "n3": "198.19.1.4"}
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _seen(node: str, missing: set[str] = frozenset(), *, own: str = "") -> NodeDrift:  # type: ignore[assignment]
    """Node `node`'s verdict: it misses `missing` (VTEPs) on VNI 100; `own`: a finding of its own."""
    findings = [DriftFinding(kind=own, message=own)] if own else []
    miss = {100: frozenset(missing)} if missing else {}
    if miss:
        findings.append(DriftFinding(kind="vteps", message="VNI 100: remote VTEPs not seen"))
    return NodeDrift(node, node, tuple(findings), looked=own == "", missing=miss)


def _by_ip(results: list[NodeDrift]) -> dict[str, tuple[str, ...]]:
    return {d.node_ip: d.kinds for d in results}


def test_a_vtep_nobody_sees_is_its_owners_finding_not_the_observers() -> None:
    # n2 looks fine itself (checked before its vtep0 went), n1 and n3 both miss its VTEP.
    out = attribute([_seen("n1", {VTEPS["n2"]}), _seen("n2"), _seen("n3", {VTEPS["n2"]})], VTEPS)
    assert _by_ip(out) == {"n1": (), "n2": ("vtep not seen",), "n3": ()}
    (f,) = out[1].findings
    assert VTEPS["n2"] in f.message and "n1, n3" in f.message


def test_a_vtep_missing_because_its_node_has_a_fault_of_its_own_is_named_there_once() -> None:
    out = attribute(
        [_seen("n1", {VTEPS["n2"]}), _seen("n2", own="bgp shutdown"), _seen("n3", {VTEPS["n2"]})], VTEPS
    )
    assert _by_ip(out) == {"n1": (), "n2": ("bgp shutdown",), "n3": ()}


def test_a_vtep_only_one_observer_misses_stays_that_observers_finding() -> None:
    out = attribute([_seen("n1"), _seen("n2"), _seen("n3", {VTEPS["n2"]})], VTEPS)
    assert _by_ip(out) == {"n1": (), "n2": (), "n3": ("vteps",)}
    assert VTEPS["n2"] in out[2].findings[0].message


def test_an_observer_with_a_fault_of_its_own_is_no_witness() -> None:
    # Two nodes: n1's VXLAN device is broken and it misses n2: n2 is not blamed for n1's view.
    broken = dataclasses.replace(_seen("n1", {VTEPS["n2"]}), looked=True)
    broken = dataclasses.replace(broken, findings=(DriftFinding(kind="vxlan", message="x"), *broken.findings))
    out = attribute([broken, _seen("n2")], {"n1": VTEPS["n1"], "n2": VTEPS["n2"]})
    assert _by_ip(out) == {"n1": ("vxlan", "vteps"), "n2": ()}


def test_a_neighbor_shut_by_hand_is_bgp_shutdown_not_a_session_or_vtep_finding() -> None:
    peer = INTENT.peer_ip
    admin = json.dumps({"peers": {peer: {"state": "Idle (Admin)", "peerState": "Admin", "pfxRcd": 0}}})
    assert bgp_admin_shutdown(admin, peer)
    assert bgp_admin_shutdown(json.dumps({"peers": {peer: {"state": "Idle", "adminShutDown": True}}}), peer)
    assert not bgp_admin_shutdown(_summary(state="Active", pfx=0), peer)
    assert not bgp_admin_shutdown("not json", peer)
    d = judge_drift(
        "198.18.0.11",
        _synced(),
        admin,
        INTENT,
        vtep_ip=VTEP,
        remote_vteps={100: set()},
        expected_vteps={"198.19.1.3"},
    )
    assert d.kinds == ("bgp shutdown",) and not d.looked
    assert d.findings[0].message == f"BGP neighbor {peer} administratively shut down"
    down = judge_drift("198.18.0.11", _synced(), _summary(state="Active", pfx=0), INTENT, vtep_ip=VTEP)
    assert down.kinds == ("bgp session",)


def _node(*kinds: str) -> NodeDrift:
    return NodeDrift("n1", "n1", tuple(DriftFinding(kind=k, message=k) for k in kinds))


def test_the_settle_window_holds_what_a_converging_fabric_shows_until_the_node_settles() -> None:
    settle = Settle(since=T0, window=60)
    now = T0 + timedelta(seconds=3)
    # Never seen since the apply: the session / routes / VTEP findings are held, the file is not.
    d = hold(_node("frr config", "bgp session", "evpn", "vteps"), None, settle, now)
    assert d.kinds == ("frr config",) and d.settling
    assert [(f.kind, why) for f, why in d.held] == [
        ("bgp session", "settling"),
        ("evpn", "settling"),
        ("vteps", "settling"),
    ]
    last = last_check(now, [f.model_dump() for f in d.findings], held_rows(d))
    assert last.settling and not settled(last, settle)
    # The next round finds it converged: settled, from now on reported (within the window too).
    clean = hold(_node(), last, settle, now + timedelta(seconds=1))
    assert not clean.drifted and not clean.held
    last = last_check(now + timedelta(seconds=1), [], held_rows(clean))
    assert settled(last, settle)
    assert hold(_node("bgp session"), last, settle, now + timedelta(seconds=2)).kinds == ("bgp session",)
    # A row from before the apply does not count as settled.
    assert not settled(last_check(T0 - timedelta(seconds=1), [], []), settle)


def test_the_settle_window_ends_and_holds_nothing_without_an_apply() -> None:
    settle = Settle(since=T0, window=60)
    late = hold(_node("bgp session"), None, settle, T0 + timedelta(seconds=61))
    assert late.kinds == ("bgp session",) and not late.held
    assert hold(_node("bgp session"), None, Settle(None, 60), T0).kinds == ("bgp session",)
    assert hold(_node("bgp session"), None, Settle(T0, 0), T0).kinds == ("bgp session",)


def test_a_vtep_finding_is_reported_when_two_rounds_in_a_row_see_it() -> None:
    none = Settle(None, 60)
    first = hold(_node("vteps"), None, none, T0)
    assert not first.drifted and [w for _, w in first.held] == ["unconfirmed"]
    last = last_check(T0, [], held_rows(first))
    assert hold(_node("vteps"), last, none, T0 + timedelta(seconds=1)).kinds == ("vteps",)
    # Still reported on the round after that (it is in the row's findings).
    assert hold(_node("vteps"), last_check(T0, [{"kind": "vteps"}], []), none, T0).kinds == ("vteps",)
    # Held while settling counts as seen: at the window's end it is reported at once.
    seen = last_check(T0, [], [{"kind": "vtep not seen", "message": "", "why": "settling"}])
    assert hold(_node("vtep not seen"), seen, Settle(T0, 1), T0 + timedelta(seconds=2)).drifted


def test_a_skewed_round_never_reports_an_untouched_node() -> None:
    """n2's vtep0 is deleted while a round runs: n2 and n1 were read before, n3 after. The
    next round reads n2 without vtep0; n3's one-round VTEP finding is never reported."""
    none = Settle(None, 60)
    round1 = attribute([_seen("n1"), _seen("n2"), _seen("n3", {VTEPS["n2"]})], VTEPS)
    round1 = [hold(d, None, none, T0) for d in round1]
    assert [d.drifted for d in round1] == [False, False, False]
    last = {d.node_ip: last_check(T0, [], held_rows(d)) for d in round1}
    round2 = attribute(
        [_seen("n1", {VTEPS["n2"]}), _seen("n2", own="vtep0 missing"), _seen("n3", {VTEPS["n2"]})], VTEPS
    )
    round2 = [hold(d, last[d.node_ip], none, T0 + timedelta(seconds=1)) for d in round2]
    assert _by_ip(round2) == {"n1": (), "n2": ("vtep0 missing",), "n3": ()}
