"""Job tokens bound to the job's life (issue 24 item 1, S1): the pure rule of jobs/tokens.py.

Each transition of the table on its own, then a property: random sequences of installer
callbacks, worker moves, stuck sweeps, cancels and time passing, driven against the rule and the
state machine, never see a callback accepted outside the table (an oracle written here, apart
from the code: steps and one /complete before /complete, one /firstboot within the window after
it, nothing once the job has ended).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from karios.common.errors import Conflict
from karios.provisioner.jobs import tokens
from karios.provisioner.jobs.tokens import Callback, TokenState, check, refusal, target
from karios.provisioner.statemachine import State, is_terminal, transition

T0 = datetime(2025, 1, 1, tzinfo=UTC)
WINDOW = 600.0
S = State


def job(state: State, installed: bool = False, job_type: str = "provision", at: datetime = T0) -> TokenState:
    return TokenState(job_id="j1", state=state, job_type=job_type, installed_at=at if installed else None)


# (callback, state, /complete already accepted) → accepted? Every other pair is refused.
ACCEPTED = {
    (Callback.step, S.booting, False),
    (Callback.step, S.installing, False),
    (Callback.step, S.stuck, False),
    (Callback.complete, S.booting, False),
    (Callback.complete, S.installing, False),
    (Callback.complete, S.stuck, False),
    (Callback.firstboot, S.first_boot, True),
    (Callback.firstboot, S.stuck, True),
}


@pytest.mark.parametrize("installed", [False, True])
@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("cb", list(Callback))
def test_the_table_accepts_exactly_its_pairs(cb: Callback, state: State, installed: bool) -> None:
    why = refusal(cb, job(state, installed), T0, WINDOW)
    assert (why is None) == ((cb, state, installed) in ACCEPTED), why


def test_a_completed_jobs_token_no_longer_accepts_firstboot() -> None:
    with pytest.raises(Conflict) as exc:
        check(Callback.firstboot, job(S.completed, installed=True), T0, WINDOW)
    assert exc.value.http_status == 409
    assert exc.value.message == "job j1 is completed: its token no longer accepts /firstboot"
    assert exc.value.details == {"job_id": "j1", "state": "completed", "callback": "firstboot"}


@pytest.mark.parametrize("state", [S.failed, S.cancelled, S.completed])
@pytest.mark.parametrize("cb", list(Callback))
def test_an_ended_job_accepts_nothing(cb: Callback, state: State) -> None:
    for installed in (False, True):
        assert f"is {state.value}: its token no longer accepts /{cb.value}" in (
            refusal(cb, job(state, installed), T0, WINDOW) or ""
        )


def test_complete_once_and_no_step_after_it() -> None:
    after = job(S.first_boot, installed=True)
    for cb in (Callback.complete, Callback.step):
        assert "already reported /complete" in (refusal(cb, after, T0, WINDOW) or "")
    # stuck after /complete: still only /firstboot (a stuck job may be either side of /complete)
    stuck = job(S.stuck, installed=True)
    assert refusal(Callback.step, stuck, T0, WINDOW) and refusal(Callback.complete, stuck, T0, WINDOW)
    assert refusal(Callback.firstboot, stuck, T0, WINDOW) is None


def test_firstboot_only_after_complete_and_within_the_window() -> None:
    assert "has not finished installing" in (refusal(Callback.firstboot, job(S.installing), T0, WINDOW) or "")
    assert "has not finished installing" in (refusal(Callback.firstboot, job(S.stuck), T0, WINDOW) or "")
    fb = job(S.first_boot, installed=True)
    assert refusal(Callback.firstboot, fb, T0 + timedelta(seconds=WINDOW), WINDOW) is None
    late = refusal(Callback.firstboot, fb, T0 + timedelta(seconds=WINDOW + 1), WINDOW)
    assert late and "window closed at 2025-01-01T00:10:00+00:00" in late


def test_an_unprovision_job_has_no_first_boot() -> None:
    why = refusal(Callback.firstboot, job(S.first_boot, True, "unprovision"), T0, WINDOW)
    assert why and "unprovision" in why


@pytest.mark.parametrize("state", [S.queued, S.building_media, S.mounting])
def test_nothing_before_the_installer_boots(state: State) -> None:
    for cb in Callback:
        assert "does not accept" in (refusal(cb, job(state), T0, WINDOW) or "")


def test_targets() -> None:
    assert target(Callback.step, "provision") == S.installing
    assert target(Callback.step, "provision", failed=True) == S.failed
    assert target(Callback.complete, "provision") == S.first_boot
    assert target(Callback.complete, "unprovision") == S.completed
    assert target(Callback.firstboot, "provision") == S.completed


# -- property: random sequences never get a callback accepted outside the table -------------


@dataclass
class Sim:
    """A job as the rule and the state machine move it, with the oracle's own bookkeeping."""

    tok: TokenState
    now: datetime = T0
    completes: int = 0
    firstboots: int = 0
    completed_at: datetime | None = None
    ended: bool = False

    def move(self, to: State, **changes: object) -> None:
        self.tok = replace(self.tok, state=transition(self.tok.state, to), **changes)  # type: ignore[arg-type]
        self.ended = self.ended or is_terminal(to)


WORKER = {S.queued: S.building_media, S.building_media: S.mounting, S.mounting: S.booting}
EVENTS = st.one_of(
    st.sampled_from(["step", "step_failed", "complete", "firstboot", "worker", "stuck", "cancel"]),
    st.floats(min_value=1, max_value=2 * WINDOW).map(lambda s: ("wait", s)),
)


def apply_callback(sim: Sim, name: str) -> bool:
    """The callback as the use cases run it: the rule, then the moves. Returns accepted?"""
    cb = Callback("step" if name == "step_failed" else name)
    if refusal(cb, sim.tok, sim.now, WINDOW) is not None:
        return False
    if cb is Callback.step:
        sim.move(target(cb, sim.tok.job_type, failed=name == "step_failed"))
    elif cb is Callback.complete:
        if sim.tok.state == S.booting:
            sim.move(S.installing)
        sim.move(S.first_boot, installed_at=sim.now)
        if target(cb, sim.tok.job_type) == S.completed:
            sim.move(S.completed)
    else:
        sim.move(target(cb, sim.tok.job_type))
    return True


def assert_in_table(sim: Sim, name: str, before: TokenState) -> None:
    """The oracle: what the issue's table allows, from the history, not from tokens.py."""
    assert before.state not in (S.queued, S.building_media, S.mounting, S.completed, S.failed, S.cancelled)
    if name in ("step", "step_failed", "complete"):
        assert sim.completes == 0, "a step or /complete after /complete"
        assert before.state in (S.booting, S.installing, S.stuck)
    if name == "complete":
        sim.completes += 1
        sim.completed_at = sim.now
    if name == "firstboot":
        assert before.job_type == "provision", "a first boot of an unprovision job"
        assert sim.completes == 1 and sim.firstboots == 0, "/firstboot before /complete or twice"
        assert sim.completed_at is not None and sim.now - sim.completed_at <= timedelta(seconds=WINDOW)
        assert before.state in (S.first_boot, S.stuck)
        sim.firstboots += 1


@settings(max_examples=1500, deadline=None)
@given(
    job_type=st.sampled_from(["provision", "unprovision"]),
    start=st.sampled_from([S.queued, S.mounting, S.booting]),
    events=st.lists(EVENTS, max_size=25),
)
def test_no_callback_is_accepted_outside_the_table(job_type: str, start: State, events: list) -> None:
    sim = Sim(TokenState(job_id="j", state=start, job_type=job_type))
    for ev in events:
        if isinstance(ev, tuple):
            sim.now += timedelta(seconds=ev[1])
        elif ev == "worker" and sim.tok.state in WORKER:
            while sim.tok.state in WORKER:  # the worker phase runs through to booting
                sim.move(WORKER[sim.tok.state])
        elif ev == "stuck" and sim.tok.state in (S.booting, S.installing, S.first_boot):
            sim.move(S.stuck)
        elif ev == "cancel" and not is_terminal(sim.tok.state):
            sim.move(S.cancelled)
        elif ev in ("step", "step_failed", "complete", "firstboot"):
            before, was_ended = sim.tok, sim.ended
            if apply_callback(sim, ev):
                assert not was_ended, f"/{ev} accepted for an ended job"
                assert_in_table(sim, ev, before)
    assert sim.completes <= 1 and sim.firstboots <= 1


def test_the_table_is_the_one_the_module_declares() -> None:
    declared = {(cb, s) for cb, states in tokens.ACCEPTS.items() for s in states}
    assert declared == {(cb, s) for cb, s, _ in ACCEPTED}
    assert {Callback.complete, Callback.firstboot} == tokens.ONCE
