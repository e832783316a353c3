"""One node's rollout: load → diff → commit → verify, rollback to the baseline, teardown
and the post-deploy checklist. The rules live in :mod:`plan`; this module only runs them
over SSH and reports progress."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from secrets import token_hex

from pydantic import BaseModel

from karios.common.errors import KariosError
from karios.common.telemetry_tracing import job_span, step_span
from karios.fabric_worker import metrics
from karios.fabric_worker.rollout.errors import (
    FabricVerifyFailed,
    HostKeyChanged,
    NodeUnreachable,
    RolloutCancelled,
)
from karios.fabric_worker.rollout.facts import (
    APPLY_DISCOVER_SCRIPT,
    DISCOVER_SCRIPT,
    NodeFacts,
    evpn_summary_of,
    find_underlay,
    overlay_of,
    parse_facts,
    running_config_of,
)
from karios.fabric_worker.rollout.intent import FabricIntent, NodeOverride, NodeTarget
from karios.fabric_worker.rollout.node_steps import apply_frr_plan, converge_after_reload, until_abort
from karios.fabric_worker.rollout.overlay import (
    OverlayView,
    ProbePlan,
    RolledOut,
    RolledOutVtep,
    hub_reset_command,
    imet_missing,
    imet_on_every_vni,
    overlay_loop_script,
    overlay_passed,
    overlay_verdict,
    parse_overlay,
    plan_probe,
    probe_message,
    probe_rtt_ms,
    probe_script,
    session_peer,
    settle_deadline,
    silent_hub,
    verify_overlay_loop_script,
)
from karios.fabric_worker.rollout.ownership import foreign_devices, with_record
from karios.fabric_worker.rollout.plan import (
    DesiredNetwork,
    FrrAction,
    baseline_network,
    frr_plan,
    frr_rollback_plan,
    network_commands,
    overlay_mtu,
)
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from karios.fabric_worker.rollout.running import RunningDiff, repair_plan, repairs, running_diff
from karios.fabric_worker.rollout.ssh import NodeSession, open_session, redact
from karios.fabric_worker.rollout.steps import (
    FRR_FORCE_STOP,
    INSTALL_FRR_SCRIPT,
    interrupt_step_script,
    step_command,
)
from karios.fabric_worker.rollout.verify import (
    VERIFY_NO_SESSION,
    no_session_verdict,
    parse_evpn_summary,
    verify_loop_script,
    verify_verdict,
)

TRACER = "karios.fabric-worker"


@dataclasses.dataclass(frozen=True)
class RolloutOptions:
    connect_timeout: float = 10.0
    command_timeout: float = 120.0
    install_timeout: float = 900.0
    verify_timeout: float = 60.0
    verify_interval: float = 0.5
    # Verify polls per second over all the nodes a job verifies at once: each poll is a vtysh
    # run on a node, so the per-node interval grows with the fan-out (CPU stays flat in N).
    verify_polls_per_s: float = 40.0
    # Post-deploy overlay checks after Established: how long every VNI may take to come up and
    # the IMET routes of the other rolled-out VTEPs to arrive (also bounds the dataplane probe).
    settle_timeout: float = 20.0
    dataplane_probe: bool = True

    def for_fanout(self, nodes: int) -> RolloutOptions:
        """These options for `nodes` nodes verifying at once (the verify poll budget shared)."""
        if self.verify_polls_per_s <= 0:
            return self
        interval = max(self.verify_interval, nodes / self.verify_polls_per_s)
        return dataclasses.replace(self, verify_interval=round(interval, 2))


@dataclasses.dataclass(frozen=True)
class NodeEvent:
    node_ip: str
    fqdn: str
    state: str  # node_*
    message: str = ""


ProgressFn = Callable[[NodeEvent], Awaitable[None]]
BaselineFn = Callable[[str, NodeFacts], Awaitable[None]]
"""Called with (node_ip, baseline) right before the first change to a node; raising a
KariosError fails the node untouched (the baseline must be kept before anything changes)."""


async def _no_progress(_: NodeEvent) -> None:
    return None


class NodeResult(BaseModel):
    node_ip: str
    fqdn: str = ""
    ok: bool = False
    reachable: bool = True  # False: SSH failed before any step ran
    changed: bool = False
    touched: bool = False  # something was changed on the node (rollback needed on abort)
    rolled_back: bool = False
    error: str = ""
    vtep_ip: str = ""
    host_key: str = ""
    host_key_first_seen: bool = False
    frr_action: str = ""
    repaired: list[str] = []  # what differed although the files equal the rendered ones
    checks: list[str] = []  # what the post-deploy overlay checks found (said in node_ready)
    steps: list[str] = []
    duration_s: float = 0.0
    # Seconds from the node's start until its verify passed (Established, EVPN routes sent).
    verified_s: float | None = None


class NodeRollout:
    """Applies the intent to one node and can put the node back to how it was before."""

    def __init__(
        self,
        target: NodeTarget,
        intent: FabricIntent,
        vtep_ip: str,
        *,
        override: NodeOverride | None = None,
        options: RolloutOptions | None = None,
        progress: ProgressFn | None = None,
        before_change: BaselineFn | None = None,
        rolled_out: RolledOut | None = None,
        keep_session: bool = False,
    ) -> None:
        self.target = target
        # `keep_session`: an applied node's SSH connection stays open for the job's closing
        # recheck (closed by it, or by release()); else each step connects anew.
        self._keep_session = keep_session
        self._kept: tuple[NodeSession, contextlib.AsyncExitStack] | None = None
        self.rolled_out = rolled_out if rolled_out is not None else RolledOut()
        self._before_change = before_change
        self._baseline_kept = False
        self.intent = intent
        self.vtep_ip = vtep_ip
        self.override = override
        self.options = options or RolloutOptions()
        self._progress = progress or _no_progress
        self.baseline: NodeFacts | None = None
        self.result = NodeResult(node_ip=target.node_ip, fqdn=target.fqdn, vtep_ip=vtep_ip)
        self._overlay: OverlayView | None = None  # the apply discovery's look at the overlay
        self._overlay_mtu = 0
        # The other VTEPs its passed overlay check expected, and those whose IMET routes it had.
        self._checked_against: set[str] = set()
        self._t0 = time.monotonic()  # when apply() started
        self._fence = token_hex(8)  # tags this run's steps; the rollback fences them
        self._secrets = intent.secrets() + [
            s.get_secret_value() for s in (target.password, target.private_key) if s is not None
        ]

    # -- helpers -----------------------------------------------------------------------

    async def _emit(self, state: str, message: str = "") -> None:
        await self._progress(NodeEvent(self.target.node_ip, self.result.fqdn, state, message))

    def _session(self):
        return open_session(self.target, connect_timeout=self.options.connect_timeout, secrets=self._secrets)

    async def _discover(self, s: NodeSession) -> NodeFacts:
        return (await self._load(s, DISCOVER_SCRIPT))[0]

    async def _load(
        self, s: NodeSession, script: str = APPLY_DISCOVER_SCRIPT
    ) -> tuple[NodeFacts, str | None, str | None]:
        """The node's facts and, with the apply's discovery, its EVPN summary and FRR's running
        config (None: bgpd down); the overlay checks' view is kept in ``self._overlay``."""
        out = (await s.run(script, limit_s=self.options.command_timeout)).stdout
        try:
            facts, evpn, running = parse_facts(out), evpn_summary_of(out), running_config_of(out)
            overlay = overlay_of(out)
            self._overlay = parse_overlay(overlay) if overlay is not None else None
            return facts, evpn, running
        except ValueError as exc:
            raise FabricVerifyFailed(f"{self.target.label}: unexpected discovery output: {exc}") from None

    def _verified_by(self, evpn_summary: str | None) -> bool:
        """Whether an EVPN summary already shows what the verify waits for."""
        if evpn_summary is None:
            return False
        peer = parse_evpn_summary(evpn_summary, self.intent.peer_ip)
        metrics.evpn_seen(self.target.node_ip, peer)
        expect_routes = bool(self.intent.vnis) and self.intent.advertise_all_vni
        return verify_verdict(peer, self.intent.peer_ip, expect_routes) is None

    def _underlay(self, facts: NodeFacts) -> tuple[str, int]:
        if self.override is not None:
            name = self.override.underlay_bridge_name or self.override.underlay_iface_hint
            iface = facts.interfaces.get(name)
            if iface is None:
                raise FabricVerifyFailed(f"{self.target.label}: override underlay {name!r} does not exist")
            return iface.name, iface.mtu
        matches = find_underlay(facts, self.intent.underlay_cidr)
        if not matches:
            raise FabricVerifyFailed(
                f"{self.target.label}: no interface with an address in {self.intent.underlay_cidr}"
            )
        return matches[0].iface, matches[0].mtu

    def _desired(self, facts: NodeFacts, underlay_mtu: int) -> DesiredNetwork:
        return DesiredNetwork(
            vtep_ip=self.vtep_ip,
            vnis=self.intent.vnis,
            overlay_mtu=overlay_mtu(self.intent.vxlan_mtu, underlay_mtu),
            managed_vnis=self.intent.vnis,
            keep=foreign_devices(facts, self.intent.vnis),  # never remove what Karios did not create
        )

    async def _keep_baseline(self) -> None:
        if not self._baseline_kept and self._before_change is not None and self.baseline is not None:
            # Shielded: a cancel must not cut a database write in half (the node is untouched yet).
            await asyncio.shield(self._before_change(self.target.node_ip, self.baseline))
        self._baseline_kept = True

    def _who(self) -> str:
        """The node as a message names it: "node2 (198.18.0.12)", or the address alone."""
        ip, name = self.target.node_ip, self.result.fqdn or self.target.fqdn
        return f"{name} ({ip})" if name and name != ip else ip

    def _check_abort(self, abort: asyncio.Event | None) -> None:
        if abort is not None and abort.is_set():
            raise RolloutCancelled(f"{self.target.label}: rollout aborted")

    # -- apply -------------------------------------------------------------------------

    async def apply(self, abort: asyncio.Event | None = None) -> NodeResult:
        """load → diff → commit → verify. Never raises: the outcome is in the result."""
        t0 = self._t0 = time.monotonic()
        r = self.result
        try:
            self._check_abort(abort)
            await self._emit("node_connecting")
            with job_span(TRACER, "fabric.node.apply", None, bind={"node": self.target.node_ip}):
                await until_abort(self._connect_and_apply(abort), abort, self.target.label)
            r.ok = True
            done = "unchanged" if not r.changed else f"FRR {r.frr_action or 'kept'}"
            await self._emit("node_ready", "; ".join([done, *r.repaired, *r.checks]))
        except KariosError as exc:
            r.ok = False
            r.error = redact(exc.message, self._secrets)
            self.rolled_out.discard(self.target.node_ip)  # no other node waits for its routes
            await self._emit("node_failed", r.error)
        finally:
            r.duration_s = round(time.monotonic() - t0, 3)
            metrics.node_applied(self.target.node_ip, r.ok, r.duration_s)
        return r

    async def _connect_and_apply(self, abort: asyncio.Event | None) -> None:
        r = self.result
        async with contextlib.AsyncExitStack() as stack:
            try:
                s = await stack.enter_async_context(self._session())
            except (NodeUnreachable, HostKeyChanged):
                r.reachable = False
                raise
            r.host_key, r.host_key_first_seen = s.host_key, s.host_key_first_seen
            await self._apply_with(s, abort)
            if self._keep_session and self.intent.vnis and self.intent.advertise_all_vni:
                self._kept = (s, stack.pop_all())  # the recheck's, or release()'s to close

    async def _apply_with(self, s: NodeSession, abort: asyncio.Event | None) -> None:
        r, opts = self.result, self.options
        with step_span(TRACER, "fabric.node.load"):
            facts, evpn, running = await self._load(s)
        self.baseline = facts
        r.fqdn = r.fqdn or facts.hostname
        iface, mtu = self._underlay(facts)
        self._overlay_mtu = overlay_mtu(self.intent.vxlan_mtu, mtu)
        self._check_abort(abort)
        if not facts.frr_installed:
            await self._keep_baseline()
            await self._emit("node_installing_frr")
            r.touched = True
            install = step_command(INSTALL_FRR_SCRIPT, killable=False, fence=self._fence)
            await s.run(install, limit_s=opts.install_timeout)
            facts, evpn, running = await self._load(s)
            r.steps.append("frr_installed")
        else:
            r.steps.append("frr_present")
        files = render_node_files(
            self.intent,
            NodeRenderInput(hostname=facts.hostname or r.fqdn, vtep_ip=self.vtep_ip, underlay_iface=iface),
        ).as_dict()
        with step_span(TRACER, "fabric.node.diff") as span:
            plan = frr_plan(facts, files)
            net = network_commands(facts, self._desired(facts, mtu))
            # Files equal and FRR running: does it RUN them? (a `vtysh` change is not in the file)
            stale = RunningDiff()
            if running and not plan.changed:
                stale = running_diff(files["frr.conf"], running)
            span.set_attributes({"karios.frr_action": plan.action.value, "karios.link_changes": len(net)})
        if not plan.changed and not net and not stale:
            r.steps.append("unchanged")
            same = "files, running config and devices" if running else "files and devices"
            await self._emit("node_unchanged", f"{same} equal the intent")
            if self._verified_by(evpn) and self._overlay_checked_by(self._overlay):
                # Nothing changed since the discovery's own EVPN summary: that was the first poll.
                await self._emit("node_verifying")
                r.steps += ["verified", "overlay_checked"]
                r.verified_s = round(time.monotonic() - self._t0, 3)
                return
        else:
            self._check_abort(abort)
            await self._keep_baseline()
            plan = repair_plan(plan, stale)  # files right, running config not: reload from them
            r.repaired = repairs(plan, net, facts, stale, self._secrets)
            await self._emit(
                "node_committing",
                "; ".join([f"{len(plan.writes)} file(s), {len(net)} link change(s)", *r.repaired]),
            )
            r.touched = r.changed = True
            plan = with_record(plan, self.baseline or facts, self.intent.vnis, net)  # what Karios made
            with step_span(TRACER, "fabric.node.commit"):
                r.frr_action = plan.action.value
                await apply_frr_plan(s, plan, opts.command_timeout, fence=self._fence, net=net)
                if plan.action is FrrAction.RELOAD:  # the reload took (else FRR restarts from the file)
                    done = await converge_after_reload(
                        s, files["frr.conf"], fence=self._fence, limit_s=opts.command_timeout
                    )
                    if done.restarted:
                        r.frr_action = FrrAction.RESTART.value
                        r.repaired.append(f"a reload left {done.left.describe(self._secrets)} → restarted")
                if net:
                    r.steps.append("vtep_configured")
            r.steps += [
                f"frr_{r.frr_action}" if plan.action is not FrrAction.NONE else "frr_config_written",
                *(["repaired"] if r.repaired else []),
            ]
        self._check_abort(abort)
        await self._emit("node_verifying")
        # The verify and the overlay checks read ONE remote loop (one exec, one vtysh run per
        # poll): the poll that verifies is the overlay checks' first look.
        opts, peer_ip = self.options, self.intent.peer_ip
        polls = self._overlay_polls() if self.intent.vnis else 0
        polls += math.ceil(opts.verify_timeout / opts.verify_interval) + 2
        if self.intent.vnis:
            script = verify_overlay_loop_script(opts.verify_interval, polls, peer_ip)
        else:
            script = verify_loop_script(opts.verify_interval, polls, peer_ip)
        probe: asyncio.Task[tuple[str, str]] | None = None
        try:
            async with contextlib.aclosing(s.lines(script, limit_s=opts.command_timeout)) as lines:
                with metrics.timed("verify", FabricVerifyFailed), step_span(TRACER, "fabric.node.verify"):
                    first = await self._verify(lines, abort)
                r.steps.append("verified")
                r.verified_s = round(time.monotonic() - self._t0, 3)
                self._advertised()
                # The DF probe overlaps the overlay checks (both wait for the fabric to converge)
                # once the bridge's address is known; its outcome counts after theirs.
                early = parse_overlay(first).link_locals.get(self._bridge(), "") if self.intent.vnis else ""
                if opts.dataplane_probe and early:
                    probe = asyncio.create_task(self._probe(s, early, abort))
                with step_span(TRACER, "fabric.node.overlay_checks"):
                    link_local = await self._overlay_from(s, lines, abort, first)
            r.steps.append("overlay_checked")
            if opts.dataplane_probe:
                with step_span(TRACER, "fabric.node.probe"):
                    step, said = await (probe if probe is not None else self._probe(s, link_local, abort))
                r.steps.append(step)
                r.checks.append(said)
        finally:
            if probe is not None and not probe.done():
                probe.cancel()
                with contextlib.suppress(BaseException):
                    await probe
        self._rolled_out(link_local)

    async def _verify(self, lines: AsyncIterator[str], abort: asyncio.Event | None) -> str:
        """Read the poll loop until the peer is Established with routes sent; returns the line
        that showed it (an overlay line when the intent has VNIs, else the EVPN summary)."""
        opts = self.options
        deadline = time.monotonic() + opts.verify_timeout
        expect_routes = bool(self.intent.vnis) and self.intent.advertise_all_vni
        verdict = "not checked"
        async for line in lines:
            self._check_abort(abort)
            if line == VERIFY_NO_SESSION:
                verdict = no_session_verdict(self.intent.peer_ip)
                if time.monotonic() >= deadline:
                    break
                continue
            if self.intent.vnis:
                peer = session_peer(parse_overlay(line), self.intent.peer_ip)
            else:
                peer = parse_evpn_summary(line, self.intent.peer_ip)
            verdict = verify_verdict(peer, self.intent.peer_ip, expect_routes) or ""
            metrics.evpn_seen(self.target.node_ip, peer)
            if not verdict:
                return line
            if time.monotonic() >= deadline:
                break
        raise FabricVerifyFailed(f"{self._who()}: {verdict} after {opts.verify_timeout:.0f} s")

    def _overlay_polls(self) -> int:
        # The loop ends by itself after twice the settle time (a VTEP counted late extends it).
        return math.ceil(2 * self.options.settle_timeout / self.options.verify_interval) + 2

    # -- post-deploy overlay checks (the rules: :mod:`.overlay`) ------------------------------

    def needs_recheck(self) -> bool:
        """Whether the job rolled out a VTEP its passed overlay check neither expected nor had
        the IMET routes of (a node checked before the others were counted never looked for
        theirs; one whose look already held them needs no second one)."""
        if not self.result.ok or not self.intent.vnis or not self.intent.advertise_all_vni:
            return False
        return bool(self._expected_vteps() - self._checked_against)

    async def recheck(self, abort: asyncio.Event | None = None) -> NodeResult:
        """The overlay checks again once every node of the job is done, against every VTEP
        rolled out (a hub that stopped sending to this node is reset as in the first check).
        Said only when it changes something: a reset (``node_ready`` again, with it) or a failure
        (``node_failed``: the node is then rolled back like any failed node)."""
        r, before = self.result, len(self.result.repaired)
        kept, self._kept = self._kept, None
        try:
            if kept is not None and not kept[0].closed:
                async with kept[1]:  # the apply's own connection, closed after this check
                    await self._check_overlay(kept[0], abort)
            else:
                if kept is not None:
                    await kept[1].aclose()
                async with self._session() as s:
                    await self._check_overlay(s, abort)
            r.steps.append("rechecked")
            if len(r.repaired) > before:
                said = ["rechecked after every node", *r.repaired[before:]]
                await self._emit("node_ready", "; ".join(said))
        except RolloutCancelled:
            pass  # the job is being cancelled: its rollback, not this check, decides
        except KariosError as exc:
            r.ok = False
            r.error = redact(f"after every node was rolled out: {exc.message}", self._secrets)
            self.rolled_out.discard(self.target.node_ip)
            await self._emit("node_failed", r.error)
        return r

    async def release(self) -> None:
        """Close the connection kept for the recheck (idempotent)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            with contextlib.suppress(Exception):
                await kept[1].aclose()

    def _expected_vteps(self) -> set[str]:
        """The other VTEPs already rolled out or verified (their routes are on the hub): this node
        must have an IMET route from each."""
        return {v.vtep_ip for v in self.rolled_out.others(self.target.node_ip, self.vtep_ip)}

    def _bridge(self) -> str:
        return f"br{self.intent.vnis[0]}" if self.intent.vnis else ""

    def _rolled_out(self, link_local: str) -> None:
        vtep = RolledOutVtep(
            self.target.node_ip,
            self._who(),
            self.vtep_ip,
            link_local,
            self._overlay_mtu,
            time.monotonic(),
            frozenset(self._checked_against),
        )
        self.rolled_out.add(vtep)

    def _advertised(self) -> None:
        """Verified: its routes went to the hub, which reflects them to every other node — a node
        checked from now on expects its IMET routes (not a probe target until its own checks pass)."""
        if self.intent.vnis and self.intent.advertise_all_vni:
            vtep = RolledOutVtep(self.target.node_ip, self._who(), self.vtep_ip, since=time.monotonic())
            self.rolled_out.add(vtep)

    def _overlay_checked_by(self, view: OverlayView | None) -> bool:
        """Whether the discovery's own look at the overlay passes the checks (a no-op re-apply
        is then still one exec); the node is then counted as rolled out."""
        if not self.intent.vnis:
            return True
        expected, evpn = self._expected_vteps(), self.intent.advertise_all_vni
        if view is None or overlay_verdict(view, self.intent.vnis, expected, evpn=evpn) is not None:
            return False
        self.result.checks.append(overlay_passed(view, self.intent.vnis, expected, evpn=evpn))
        self._checked_against = expected | imet_on_every_vni(view, self.intent.vnis)
        self._rolled_out(view.link_locals.get(self._bridge(), ""))
        return True

    async def _check_overlay(self, s: NodeSession, abort: asyncio.Event | None) -> str:
        """(a) every configured VNI on the node (FRR's VNI tables, its VXLAN device up) and (b) an
        IMET route from every other rolled-out VTEP (those counted by each poll: a node of the
        same job verified meanwhile is waited for too), polled until `settle_timeout` (one exec
        streaming a line per poll, like the verify). Returns the probe bridge's link-local."""
        if not self.intent.vnis:
            return ""
        script = overlay_loop_script(self.options.verify_interval, self._overlay_polls())
        async with contextlib.aclosing(s.lines(script, limit_s=self.options.command_timeout)) as lines:
            return await self._overlay_from(s, lines, abort)

    async def _overlay_from(
        self, s: NodeSession, lines: AsyncIterator[str], abort: asyncio.Event | None, first: str | None = None
    ) -> str:
        """The overlay checks on a stream of overlay lines (`first`: one already read)."""
        vnis = self.intent.vnis
        if not vnis:
            return ""
        opts, evpn = self.options, self.intent.advertise_all_vni
        t0 = time.monotonic()
        state = {"verdict": "not checked", "window": opts.settle_timeout, "reset_at": 0.0}

        async def look(line: str) -> str | None:
            """One poll: the link-local when the checks pass, None to go on; raises at the end."""
            self._check_abort(abort)
            peers = self.rolled_out.others(self.target.node_ip, self.vtep_ip)
            expected = {p.vtep_ip for p in peers}
            view = None if line == VERIFY_NO_SESSION else parse_overlay(line)
            if view is None:  # the session went away after the verify
                verdict = no_session_verdict(self.intent.peer_ip)
            else:
                verdict = overlay_verdict(view, vnis, expected, evpn=evpn) or ""
            state["verdict"] = verdict
            now = time.monotonic()
            if view is not None and not verdict:
                passed = overlay_passed(view, vnis, expected, evpn=evpn)
                self.result.checks.append(f"{passed} after {now - t0:.1f} s")
                self._checked_against = expected | imet_on_every_vni(view, vnis)
                return view.link_locals.get(self._bridge(), "")
            silent = view is not None and not state["reset_at"] and evpn
            if silent and view is not None and await self._reset_silent_hub(s, view, expected):
                state["reset_at"] = time.monotonic()  # once per check; then the window again
            deadline = settle_deadline(t0, peers, opts.settle_timeout)
            deadline = max(deadline, state["reset_at"] + opts.settle_timeout)
            state["window"] = deadline - t0  # the settle time, longer when a VTEP was counted late
            if now >= deadline:
                raise FabricVerifyFailed(f"{self._who()}: {verdict} after {state['window']:.0f} s")
            return None

        if first is not None and (found := await look(first)) is not None:
            return found
        async for line in lines:
            if (found := await look(line)) is not None:
                return found
        raise FabricVerifyFailed(f"{self._who()}: {state['verdict']} after {state['window']:.0f} s")

    async def _reset_silent_hub(self, s: NodeSession, view: OverlayView, expected: set[str]) -> bool:
        """Reset the session to a hub that sends this node nothing (:func:`.overlay.silent_hub`);
        said in node_ready. Whether it was reset."""
        peer = self.intent.peer_ip
        why = silent_hub(view, peer, imet_missing(view, self.intent.vnis, expected))
        if not why:
            return False
        await s.run(hub_reset_command(peer), check=False, limit_s=self.options.command_timeout)
        self.result.repaired.append(why)
        self.result.steps.append("hub_session_reset")
        return True

    async def _probe(self, s: NodeSession, link_local: str, abort: asyncio.Event | None) -> tuple[str, str]:
        """(c) a DF ping at the overlay MTU to another rolled-out node's bridge, across VXLAN:
        (its step, what it found, said in node_ready with its time). No overlay address:
        skipped, and said so. A lost echo raises, unless the peer's fault (inconclusive)."""
        peers = self.rolled_out.others(self.target.node_ip, self.vtep_ip)
        plan = plan_probe(
            peers,
            self.intent.vnis,
            self._overlay_mtu,
            link_local,
            evpn=self.intent.advertise_all_vni,
            own_vtep=self.vtep_ip,
        )
        if not isinstance(plan, ProbePlan):
            return "probe_skipped", f"dataplane probe skipped: {plan}"
        self._check_abort(abort)
        deadline = max(1, math.ceil(self.options.settle_timeout))
        t0 = time.monotonic()
        out = await s.run(probe_script(plan, deadline), check=False, limit_s=self.options.command_timeout)
        elapsed = time.monotonic() - t0
        rtt = probe_rtt_ms(out.stdout)
        message = probe_message(plan, rtt, elapsed)
        if rtt is None and self.vtep_ip not in plan.target.checked_against:
            # The peer's own check passed before this node was counted: it never looked for this
            # node's IMET route, so the echo may be lost on its side (a hub that stopped sending
            # to it: the job rechecks it at its end, and repairs or fails *it*). Not this node's
            # failure: said, not raised.
            return "probe_inconclusive", (
                f"{message}; inconclusive: {plan.target.label} was checked before this node was counted"
                " (it is checked again at the end of the job)"
            )
        if rtt is None:
            raise FabricVerifyFailed(f"{self._who()}: {message}")
        return "probe_ok", message

    # -- rollback ------------------------------------------------------------------------

    async def rollback(self) -> None:
        """Put the node back to its baseline (previous files, FRR state, vtep0/VXLAN devices)."""
        if self.baseline is None:
            return
        t0 = time.monotonic()
        with job_span(TRACER, "fabric.node.rollback", None, bind={"node": self.target.node_ip}) as span:
            ok, msg = await rollback_node(
                self.target,
                self.baseline,
                self.intent.vnis,
                options=self.options,
                secrets=self._secrets,
                progress=self._progress,
                fqdn=self.result.fqdn,
                fence=self._fence,
            )
            span.set_attribute("karios.outcome", "ok" if ok else "failed")
        metrics.step_done("rollback", ok, time.monotonic() - t0)
        if ok:
            self.result.rolled_back = True
        else:
            self.result.error = f"{self.result.error}; rollback failed: {msg}".lstrip("; ")


async def rollback_node(
    target: NodeTarget,
    baseline: NodeFacts,
    vnis: tuple[int, ...],
    *,
    options: RolloutOptions | None = None,
    secrets: list[str] | None = None,
    progress: ProgressFn | None = None,
    fqdn: str = "",
    fence: str = "",
) -> tuple[bool, str]:
    """Restore one node to `baseline` (files byte for byte, FRR running or not, vtep0 and the
    VXLAN devices). Idempotent: a node already at its baseline gets no change. Used by an
    aborted apply and by a peer recovering a crashed worker's apply (persisted baseline)."""
    opts = options or RolloutOptions()
    emit = progress or _no_progress
    secret_list = list(secrets or [])
    label = fqdn or target.fqdn
    await emit(NodeEvent(target.node_ip, label, "node_rolling_back"))
    try:
        async with open_session(target, connect_timeout=opts.connect_timeout, secrets=secret_list) as s:
            # An interrupted package install is waited for (never killed): up to install_timeout.
            # With the apply's fence token: a step it sent that starts only now does not run.
            killed = await s.run(interrupt_step_script(fence), limit_s=opts.install_timeout)
            if "interrupted" in killed.stdout:  # a cancel cut a step short: FRR's state is unknown
                await s.run(FRR_FORCE_STOP, limit_s=opts.command_timeout)
            try:
                current = parse_facts((await s.run(DISCOVER_SCRIPT, limit_s=opts.command_timeout)).stdout)
            except ValueError as exc:
                raise FabricVerifyFailed(f"{target.label}: unexpected discovery output: {exc}") from None
            plan = frr_rollback_plan(baseline, current)
            net = network_commands(current, baseline_network(baseline, tuple(vnis)))
            # FRR stopped before its devices go; else the devices are back before FRR starts.
            await apply_frr_plan(
                s, plan, opts.command_timeout, net=net, net_first=plan.action is not FrrAction.STOP
            )
        await emit(NodeEvent(target.node_ip, label, "node_rolled_back"))
        return True, ""
    except KariosError as exc:
        msg = redact(exc.message, secret_list)
        await emit(NodeEvent(target.node_ip, label, "node_rollback_failed", msg))
        return False, msg
