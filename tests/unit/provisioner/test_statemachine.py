"""The job state machine's transition table, exhaustively."""

from __future__ import annotations

import itertools

import pytest

from karios.common.errors import Conflict
from karios.provisioner.statemachine import (
    INFO,
    TRANSITIONS,
    WORKER_STATES,
    State,
    allowed,
    is_terminal,
    transition,
)

S = State
HAPPY_PATH = [S.queued, S.building_media, S.mounting, S.booting, S.installing, S.first_boot, S.completed]
EXPECTED = {
    S.queued: {S.building_media, S.failed, S.cancelled},
    S.building_media: {S.mounting, S.failed, S.cancelled},
    S.mounting: {S.booting, S.failed, S.cancelled},
    S.booting: {S.installing, S.stuck, S.failed, S.cancelled},
    S.installing: {S.installing, S.first_boot, S.stuck, S.failed, S.cancelled},
    S.first_boot: {S.first_boot, S.completed, S.stuck, S.failed, S.cancelled},
    S.stuck: {S.installing, S.first_boot, S.completed, S.failed, S.cancelled},
    S.completed: set(),
    S.failed: set(),
    S.cancelled: set(),
}


@pytest.mark.parametrize(("cur", "tgt"), list(itertools.product(State, State)))
def test_every_pair_is_allowed_exactly_when_the_table_says(cur, tgt):
    assert allowed(cur, tgt) == (tgt in EXPECTED[cur])
    if tgt in EXPECTED[cur]:
        assert transition(cur, tgt) is tgt
    else:
        with pytest.raises(Conflict):
            transition(cur, tgt)


def test_table_covers_every_state_and_the_happy_path_in_order():
    assert set(TRANSITIONS) == set(State) == set(INFO)
    for a, b in itertools.pairwise(HAPPY_PATH):
        assert allowed(a, b)
    assert [INFO[s].percent for s in HAPPY_PATH] == sorted(INFO[s].percent for s in HAPPY_PATH)


def test_terminal_states_accept_nothing_and_show_their_status():
    for s in (S.completed, S.failed, S.cancelled):
        assert is_terminal(s) and not TRANSITIONS[s]
        assert INFO[s].status == s.value
    assert INFO[S.building_media].stage == "Building ISO"
    assert INFO[S.mounting].stage == "Mounting ISO"
    assert INFO[S.installing].stage == "Installing OS"


def _reachable(start: State) -> set[State]:
    seen, todo = set(), [start]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_booting_is_entered_once_per_job_so_the_power_reset_happens_at_most_once():
    """The worker sends the reset only after its ``mounting → booting`` commit: that move must be
    the only way into booting, and nothing after it may lead back to the worker phase."""
    assert {s for s in State if allowed(s, S.booting)} == {S.mounting}
    assert not (_reachable(S.booting) & {S.mounting, S.booting, *WORKER_STATES})


def test_worker_states_are_the_phase_a_replica_resumes():
    assert {S.queued, S.building_media, S.mounting} == WORKER_STATES
    assert not any(INFO[s].watched for s in WORKER_STATES)  # the stuck checker covers the rest
    watched_or_done = {s for s in State if INFO[s].watched or INFO[s].terminal or s == S.stuck}
    assert watched_or_done == set(State) - WORKER_STATES
