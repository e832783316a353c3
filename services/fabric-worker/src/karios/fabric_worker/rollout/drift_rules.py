"""Drift without false alarms (pure): whose finding a missing VTEP is, and when a finding is
reported. No I/O, no clock: the caller passes ``now``.

Attribution (:func:`attribute`). A node's ``show evpn vni`` view misses a remote VTEP either
because the VTEP's owner stopped advertising it (its vtep0 deleted, its BGP session shut, FRR
stopped…) or because the observer itself lost it. Every node's view is read in the same round,
so the round decides:

- a VTEP whose owner has a finding of its own (anything but a VTEP finding) is explained by it:
  nobody else reports it;
- a VTEP that *every* healthy other node misses is its owner's finding (``vtep not seen``,
  naming who misses it), not the observers';
- a VTEP that only some healthy nodes miss stays a ``vteps`` finding of those observers.

Reporting (:func:`hold`). A node's findings are held back, not reported, when:

- ``settling``: after an apply or teardown ended (``Settle.since``) and for ``Settle.window``
  seconds, findings of a fabric converging (BGP session not Established, no EVPN routes, VTEPs
  not seen) are held until the node has been seen without them once (its sessions re-established)
  or the window ends. What the node carries (files, vtep0, VXLAN devices, MTU, FRR running, a BGP
  neighbor shut down by hand) is reported at once;
- ``unconfirmed``: a VTEP finding is reported when two rounds in a row see it. One round reads
  the nodes one after another, so a change made during the round can show on an observer before
  the round reaches the node that changed; the next round names it on that node.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from karios.common.contracts.fabric_rollout import DriftFinding
from karios.fabric_worker.rollout.drift import NodeDrift, missing_findings

VTEP_KINDS = frozenset({"vteps", "vtep not seen"})
CONVERGING = frozenset({"bgp session", "evpn"}) | VTEP_KINDS
SETTLING, UNCONFIRMED = "settling", "unconfirmed"


def _own_fault(d: NodeDrift) -> bool:
    return bool(set(d.kinds) - VTEP_KINDS)


def _seen_missing(d: NodeDrift) -> frozenset[str]:
    return frozenset().union(*d.missing.values()) if d.missing else frozenset()


def attribute(results: list[NodeDrift], vtep_of: dict[str, str]) -> list[NodeDrift]:
    """Each missing VTEP named once, on the node it belongs to (see the module text)."""
    faulty = {d.node_ip for d in results if _own_fault(d)}
    witnesses = [d for d in results if d.looked and d.node_ip not in faulty]
    explained = {vtep_of[ip] for ip in faulty if ip in vtep_of}
    blamed: dict[str, list[str]] = {}
    for d in results:
        vtep = vtep_of.get(d.node_ip)
        if vtep is None or d.node_ip in faulty:
            continue
        others = [w for w in witnesses if w.node_ip != d.node_ip]
        missed = [w.label for w in others if vtep in _seen_missing(w)]
        if others and len(missed) == len(others):
            blamed[d.node_ip] = missed
            explained.add(vtep)
    out = []
    for d in results:
        missing = {v: m - explained for v, m in d.missing.items() if m - explained}
        findings = [f for f in d.findings if f.kind not in VTEP_KINDS] + missing_findings(missing)
        if d.node_ip in blamed:
            who = ", ".join(sorted(blamed[d.node_ip]))
            message = f"this node's VTEP {vtep_of[d.node_ip]} is not seen by {who} (not advertised)"
            findings.append(DriftFinding(kind="vtep not seen", message=message))
        out.append(dataclasses.replace(d, findings=tuple(findings), missing=missing))
    return out


@dataclasses.dataclass(frozen=True)
class Settle:
    """The settle window: `since` the end of the last apply/teardown (None: none ran)."""

    since: datetime | None
    window: float

    def open(self, now: datetime) -> bool:
        return self.since is not None and now < self.since + timedelta(seconds=self.window)


@dataclasses.dataclass(frozen=True)
class LastCheck:
    """What the node's stored row says of the round before."""

    checked_at: datetime
    kinds: frozenset[str]  # reported and held
    settling: bool  # it held findings because the fabric was settling


def settled(last: LastCheck | None, settle: Settle) -> bool:
    """The node was seen, since the apply ended, without holding anything for settling."""
    return (
        last is not None and settle.since is not None and last.checked_at > settle.since and not last.settling
    )


def hold(d: NodeDrift, last: LastCheck | None, settle: Settle, now: datetime) -> NodeDrift:
    """Split `d`'s findings into reported and held (see the module text)."""
    settling = settle.open(now) and not settled(last, settle)
    report: list[DriftFinding] = []
    held: list[tuple[DriftFinding, str]] = []
    for f in d.findings:
        if settling and f.kind in CONVERGING:
            held.append((f, SETTLING))
        elif f.kind in VTEP_KINDS and (last is None or f.kind not in last.kinds):
            held.append((f, UNCONFIRMED))
        else:
            report.append(f)
    return dataclasses.replace(d, findings=tuple(report), held=tuple(held))


def held_rows(d: NodeDrift) -> list[dict]:
    return [{"kind": f.kind, "message": f.message, "why": why} for f, why in d.held]


def last_check(checked_at: datetime, findings: list[dict], held: list[dict]) -> LastCheck:
    """A :class:`LastCheck` from a stored row's columns."""
    kinds = {f.get("kind", "") for f in findings} | {h.get("kind", "") for h in held}
    return LastCheck(checked_at, frozenset(kinds), any(h.get("why") == SETTLING for h in held))
