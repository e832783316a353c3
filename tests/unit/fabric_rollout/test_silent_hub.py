"""A hub that lost a node's dynamic peer (issue 23, the matrix's old retries): the rule that tells
it from a slow or empty fabric, on FRR 8.4 output recorded in the lab at the fault
(``evpn_summary_node1_silent_hub.json``: node1's session Established 7 s, 1 route sent, none
received; ``evpn_summary_hub_lost_node1.json``: the hub at that moment lists only node2)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from karios.fabric_worker.rollout.errors import FabricVerifyFailed
from karios.fabric_worker.rollout.facts import APPLY_DISCOVER_SCRIPT
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.node import NodeEvent, NodeRollout, RolloutOptions
from karios.fabric_worker.rollout.overlay import (
    SILENT_HUB_AFTER_S,
    OverlayView,
    ProbePlan,
    RolledOut,
    RolledOutVtep,
    Session,
    hub_reset_command,
    parse_overlay,
    parse_sessions,
    plan_probe,
    silent_hub,
)
from karios.fabric_worker.rollout.ssh import CommandResult
from tests.unit.fabric_rollout.lab import overlay_line
from tests.unit.fabric_rollout.test_noop_verify import (
    INTENT,
    VTEP,
    RecordingSession,
    _applied_discovery,
    _summary,
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


# -- the node apply: a silent hub is reset once, an early node is rechecked ------------------------

GHOST = RolledOutVtep("198.18.0.19", "node9 (198.18.0.19)", "198.19.1.9", "", 8950)


def _line(session: dict, *, imet_from_ghost: bool) -> str:
    """node2's recorded overlay poll line with an EVPN summary (the 4th document) appended; with
    `imet_from_ghost`, its IMET routes from 198.19.1.3 re-labelled as the ghost's."""
    vtysh, _, links = overlay_line().partition("\t")
    if imet_from_ghost:
        vtysh = vtysh.replace("198.19.1.3", "198.19.1.9")
    return vtysh + json.dumps({"peers": {INTENT.peer_ip: session}}) + "\t" + links


class ResetRecordingSession(RecordingSession):
    async def run(self, command: str, *, input=None, limit_s: float = 60.0, check: bool = True):  # type: ignore[no-untyped-def]
        if command == APPLY_DISCOVER_SCRIPT:
            return await super().run(command, input=input, limit_s=limit_s, check=check)
        self.execs.append(command)
        return CommandResult(0, "", "")


def _node(rolled: RolledOut, events: list[NodeEvent] | None = None) -> NodeRollout:
    async def progress(ev: NodeEvent) -> None:
        (events if events is not None else []).append(ev)

    target = NodeTarget(node_ip="198.18.0.12", fqdn="node2", password="x")
    opts = RolloutOptions(verify_timeout=5, verify_interval=0.01, settle_timeout=0.5)
    return NodeRollout(target, INTENT, VTEP, options=opts, rolled_out=rolled, progress=progress)


SILENT = {"state": "Established", "peerUptimeMsec": 9000, "pfxRcd": 0, "pfxSnt": 1}
HEALTHY = {"state": "Established", "peerUptimeMsec": 1000, "pfxRcd": 3, "pfxSnt": 1}


async def test_the_apply_resets_a_silent_hub_once_then_passes_and_says_so() -> None:
    run = _node(RolledOut((GHOST,)))
    overlay = [_line(SILENT, imet_from_ghost=False)] * 3 + [_line(HEALTHY, imet_from_ghost=True)]
    s = ResetRecordingSession(_applied_discovery(None), polls=[_summary("Established")], overlay=overlay)
    await run._apply_with(s, None)
    assert s.execs.count(hub_reset_command(INTENT.peer_ip)) == 1  # three silent polls, one reset
    assert "hub_session_reset" in run.result.steps and run.result.steps[-2] == "overlay_checked"
    (said,) = run.result.repaired
    assert said.startswith(f"the session to {INTENT.peer_ip} was Established 9 s") and "198.19.1.9" in said


async def test_a_hub_that_sends_something_is_never_reset() -> None:
    run = _node(RolledOut((GHOST,)))
    overlay = [_line(HEALTHY, imet_from_ghost=False)] * 4
    s = ResetRecordingSession(_applied_discovery(None), polls=[_summary("Established")], overlay=overlay)
    with pytest.raises(FabricVerifyFailed, match=r"no IMET .* from VTEP 198\.19\.1\.9"):
        await run._apply_with(s, None)
    assert hub_reset_command(INTENT.peer_ip) not in s.execs


async def test_a_node_checked_before_the_others_were_counted_is_rechecked() -> None:
    rolled = RolledOut()
    events: list[NodeEvent] = []
    run = _node(rolled, events)
    s = ResetRecordingSession(_applied_discovery(None), polls=[_summary("Established")])
    await run._apply_with(s, None)
    run.result.ok = True  # as apply() sets it
    assert not run.needs_recheck()  # nobody else counted: its check expected no one
    rolled.add(RolledOutVtep("198.18.0.11", "node1 (198.18.0.11)", "198.19.1.1", "fe80::1", 8950))
    assert not run.needs_recheck()  # counted later, but its IMET routes were in node2's look already
    rolled.add(GHOST)  # counted later, and its routes were not there: look again
    assert run.needs_recheck()
    late = [_line(HEALTHY, imet_from_ghost=True)]  # meanwhile they came
    run._session = lambda: _Ctx(ResetRecordingSession("", polls=[], overlay=late))  # type: ignore[method-assign]
    events.clear()
    await run.recheck()
    assert run.result.ok and run.result.steps[-1] == "rechecked" and not events  # said only on a change
    assert not run.needs_recheck()
    rolled.add(dataclasses.replace(GHOST, node_ip="198.18.0.17", vtep_ip="198.19.1.7"))  # never arrives
    assert run.needs_recheck()
    await run.recheck()
    assert not run.result.ok
    assert run.result.error.startswith(
        "after every node was rolled out: node2 (198.18.0.12): VNI 100: no IMET"
    )
    assert "198.19.1.7" in run.result.error
    assert [e.state for e in events] == ["node_failed"]
    assert "198.18.0.12" not in {v.node_ip for v in rolled.others("x", "y")}  # nobody waits for it


class _Ctx:
    def __init__(self, s: RecordingSession) -> None:
        self.s = s

    async def __aenter__(self) -> RecordingSession:
        return self.s

    async def __aexit__(self, *exc: object) -> None:
        return None


async def test_a_recheck_cut_by_a_cancel_does_not_fail_the_node() -> None:
    rolled = RolledOut((GHOST,))
    run = _node(rolled)
    run.result.ok = True
    run._session = lambda: _Ctx(ResetRecordingSession("", polls=[]))  # type: ignore[method-assign]
    abort = asyncio.Event()
    abort.set()
    await run.recheck(abort)
    assert run.result.ok and not run.result.error  # the cancel's rollback decides, not the check


# -- the probe: a peer checked before this node was counted -----------------------------------


def test_the_probe_prefers_a_peer_whose_check_saw_this_node() -> None:
    early = RolledOutVtep("198.18.0.11", "node1 (198.18.0.11)", "198.19.1.1", "fe80::1", 8950)
    late = dataclasses.replace(early, node_ip="198.18.0.13", label="node3", vtep_ip="198.19.1.3",
                               link_local="fe80::3", checked_against=frozenset({"198.19.1.2"}))  # fmt: skip
    plan = plan_probe((early, late), (100,), 8950, "fe80::2", own_vtep="198.19.1.2")
    assert isinstance(plan, ProbePlan) and plan.target is late
    plan = plan_probe((early,), (100,), 8950, "fe80::2", own_vtep="198.19.1.2")
    assert isinstance(plan, ProbePlan) and plan.target is early  # none saw it: the first still


async def test_a_lost_echo_from_a_peer_checked_before_this_node_is_inconclusive_not_a_failure() -> None:
    early = RolledOutVtep("198.18.0.11", "node1 (198.18.0.11)", "198.19.1.1", "fe80::1", 8950)
    run = _node(RolledOut((early,)))
    run._overlay_mtu = 8950
    s = ResetRecordingSession(_applied_discovery(None), polls=[])  # the ping prints nothing: no echo
    step, said = await run._probe(s, "fe80::2", None)
    assert step == "probe_inconclusive"
    assert "no reply after" in said and "inconclusive: node1 (198.18.0.11)" in said
    saw_me = dataclasses.replace(early, checked_against=frozenset({VTEP}))
    run = _node(RolledOut((saw_me,)))
    run._overlay_mtu = 8950
    with pytest.raises(FabricVerifyFailed, match="no reply after"):
        await run._probe(s, "fe80::2", None)  # its reply path was checked: this node's failure


# -- the recheck on the apply's own connection ---------------------------------------------------


class _CountingCtx(_Ctx):
    """A session factory's context that counts connects and closes."""

    opened = closed = 0

    async def __aenter__(self) -> RecordingSession:
        type(self).opened += 1
        return self.s

    async def __aexit__(self, *exc: object) -> None:
        type(self).closed += 1


async def test_the_recheck_reuses_the_apply_connection_and_closes_it_after() -> None:
    rolled = RolledOut()
    target = NodeTarget(node_ip="198.18.0.12", fqdn="node2", password="x")
    opts = RolloutOptions(verify_timeout=5, verify_interval=0.01, settle_timeout=0.5, dataplane_probe=False)
    run = NodeRollout(target, INTENT, VTEP, options=opts, rolled_out=rolled, keep_session=True)
    s = ResetRecordingSession(_applied_discovery(None), polls=[_summary("Established")])
    s.closed, s.host_key, s.host_key_first_seen = False, "", False  # type: ignore[attr-defined]
    _CountingCtx.opened = _CountingCtx.closed = 0
    run._session = lambda: _CountingCtx(s)  # type: ignore[method-assign]
    result = await run.apply()
    assert result.ok, result.error
    assert (_CountingCtx.opened, _CountingCtx.closed) == (1, 0)  # kept open for the job's recheck
    rolled.add(GHOST)  # counted after its check, its IMET routes not in that look
    assert run.needs_recheck()
    s.overlay = [_line(HEALTHY, imet_from_ghost=True)]  # they came meanwhile
    await run.recheck()
    assert run.result.steps[-1] == "rechecked" and run.result.ok
    assert (_CountingCtx.opened, _CountingCtx.closed) == (1, 1)  # no second handshake; closed after
    await run.release()  # idempotent: nothing left to close
    assert _CountingCtx.closed == 1


async def test_a_kept_connection_is_released_when_no_recheck_needs_it() -> None:
    target = NodeTarget(node_ip="198.18.0.12", fqdn="node2", password="x")
    opts = RolloutOptions(verify_timeout=5, verify_interval=0.01, settle_timeout=0.5, dataplane_probe=False)
    run = NodeRollout(target, INTENT, VTEP, options=opts, keep_session=True)
    s = ResetRecordingSession(_applied_discovery(None), polls=[_summary("Established")])
    s.closed, s.host_key, s.host_key_first_seen = False, "", False  # type: ignore[attr-defined]
    _CountingCtx.opened = _CountingCtx.closed = 0
    run._session = lambda: _CountingCtx(s)  # type: ignore[method-assign]
    assert (await run.apply()).ok
    assert not run.needs_recheck()
    await run.release()
    assert (_CountingCtx.opened, _CountingCtx.closed) == (1, 1)


# -- the probe overlaps the overlay checks ---------------------------------------------------------


class _SlowOverlaySession(ResetRecordingSession):
    """Overlay looks 50 ms apart; records how many had been read when the ping was sent, and
    answers it with `echo` (a reply) or hangs (`hang`: cancelled or never answered)."""

    def __init__(self, *a, echo: str = "", hang: bool = False, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        self.read, self.ping_after, self.echo, self.hang = 0, -1, echo, hang
        self.ping_cancelled = False

    async def lines(self, command: str, *, limit_s: float = 60.0):  # type: ignore[no-untyped-def,override]
        async for line in super().lines(command, limit_s=limit_s):
            self.read += 1
            yield line
            await asyncio.sleep(0.05)

    async def run(self, command: str, *, input=None, limit_s: float = 60.0, check: bool = True):  # type: ignore[no-untyped-def]
        if command.startswith("i=0; while") and "ping -6" in command:
            self.ping_after = self.read
            if self.hang:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    self.ping_cancelled = True
                    raise
            return CommandResult(0, self.echo, "")
        return await super().run(command, input=input, limit_s=limit_s, check=check)


ECHO = "64 bytes from fe80::1%br100: icmp_seq=1 ttl=64 time=0.113 ms\n1 packets transmitted, 1 received"


async def test_the_probe_starts_with_the_overlay_checks_and_counts_after_them() -> None:
    peer = RolledOutVtep("198.18.0.11", "node1 (198.18.0.11)", "198.19.1.1", "fe80::1", 8950)
    run = _node(RolledOut((dataclasses.replace(peer, checked_against=frozenset({VTEP})),)))
    # node2 waits for a VTEP's routes over three looks; they come at the third.
    overlay = [_line(HEALTHY, imet_from_ghost=False)] * 2 + [_line(HEALTHY, imet_from_ghost=True)]
    run.rolled_out.add(GHOST)
    s = _SlowOverlaySession(
        _applied_discovery(None), polls=[_summary("Established")], overlay=overlay, echo=ECHO
    )
    await run._apply_with(s, None)
    assert s.ping_after == 1  # sent after the verifying look, before the overlay checks passed
    assert run.result.steps[-3:] == ["verified", "overlay_checked", "probe_ok"]
    assert "rtt 0.113 ms" in run.result.checks[-1]


async def test_an_overlay_failure_cancels_the_probe_running_beside_it() -> None:
    peer = RolledOutVtep("198.18.0.11", "node1 (198.18.0.11)", "198.19.1.1", "fe80::1", 8950)
    run = _node(RolledOut((dataclasses.replace(peer, checked_against=frozenset({VTEP})), GHOST)))
    overlay = [_line(HEALTHY, imet_from_ghost=False)] * 40  # the ghost's routes never come
    s = _SlowOverlaySession(
        _applied_discovery(None), polls=[_summary("Established")], overlay=overlay, hang=True
    )
    with pytest.raises(FabricVerifyFailed, match=r"no IMET .* from VTEP 198\.19\.1\.9"):
        await run._apply_with(s, None)
    assert s.ping_after == 1 and s.ping_cancelled  # the probe ran beside it and was stopped
