"""The job state machine, declared once: states, allowed transitions, and what the UI shows.

Pure: no I/O. ``transition(state, target)`` raises :class:`Conflict` for a move the table does
not allow, so a late callback for a finished job changes nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from karios.common.errors import Conflict
from karios.common.provisioning import TERMINAL_STATES


class State(enum.StrEnum):
    queued = "queued"
    building_media = "building_media"
    mounting = "mounting"
    booting = "booting"
    installing = "installing"
    first_boot = "first_boot"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"
    stuck = "stuck"


@dataclass(frozen=True)
class StateInfo:
    stage: str  # provision_progresses.stage
    percent: int
    status: str  # provision_progresses.status / jobs.status
    terminal: bool = False
    watched: bool = False  # has a per-stage deadline (stuck detection)


S = State
INFO: dict[State, StateInfo] = {
    S.queued: StateInfo("Queued", 0, "running"),
    S.building_media: StateInfo("Building ISO", 10, "running"),
    S.mounting: StateInfo("Mounting ISO", 25, "running"),
    S.booting: StateInfo("Booting", 35, "running", watched=True),
    S.installing: StateInfo("Installing OS", 50, "running", watched=True),
    S.first_boot: StateInfo("First boot", 90, "running", watched=True),
    S.completed: StateInfo("Completed", 100, "completed", terminal=True),
    S.failed: StateInfo("Failed", 0, "failed", terminal=True),
    S.cancelled: StateInfo("Cancelled", 0, "cancelled", terminal=True),
    S.stuck: StateInfo("Stuck", 0, "stuck"),
}

TERMINAL = frozenset(s for s, info in INFO.items() if info.terminal)
if {s.value for s in TERMINAL} != TERMINAL_STATES:  # the gateway reads the shared definition
    raise RuntimeError("karios.common.provisioning.TERMINAL_STATES disagrees with the state machine")

_ACTIVE = {S.queued, S.building_media, S.mounting, S.booting, S.installing, S.first_boot, S.stuck}
# The worker phase: a provisioner replica holds a lease on these and resumes them after a crash.
# From booting on the job waits for the installer (callbacks + stage deadline), not for a worker.
WORKER_STATES = frozenset({S.queued, S.building_media, S.mounting})

# The one table. Every non-terminal state may fail or be cancelled; a stuck job comes back
# when the installer reports again.
TRANSITIONS: dict[State, frozenset[State]] = {
    S.queued: frozenset({S.building_media}),
    S.building_media: frozenset({S.mounting}),
    S.mounting: frozenset({S.booting}),
    S.booting: frozenset({S.installing, S.stuck}),
    S.installing: frozenset({S.installing, S.first_boot, S.stuck}),
    S.first_boot: frozenset({S.first_boot, S.completed, S.stuck}),
    S.stuck: frozenset({S.installing, S.first_boot, S.completed}),
    S.completed: frozenset(),
    S.failed: frozenset(),
    S.cancelled: frozenset(),
}
TRANSITIONS = {
    s: (targets | {S.failed, S.cancelled}) if s in _ACTIVE else targets for s, targets in TRANSITIONS.items()
}


def allowed(current: State | str, target: State | str) -> bool:
    return State(target) in TRANSITIONS[State(current)]


def transition(current: State | str, target: State | str) -> State:
    """The new state, or :class:`Conflict` (409) when the table forbids the move."""
    cur, tgt = State(current), State(target)
    if tgt not in TRANSITIONS[cur]:
        raise Conflict(f"job is {cur.value}; cannot become {tgt.value}", details={"state": cur.value})
    return tgt


def is_terminal(state: State | str) -> bool:
    return INFO[State(state)].terminal


#: The log level of the line a job's end writes (``jobs.service.JobService.move``): an outcome an
#: operator expects is INFO, a failure ERROR, a stuck job (it may still come back) WARNING.
END_LOG_LEVEL: dict[State, str] = {
    S.completed: "info",
    S.cancelled: "info",
    S.failed: "error",
    S.stuck: "warning",
}


def end_log_level(state: State | str, previous: State | str) -> str | None:
    """The level of the "job ended" line for a move ``previous`` → ``state``; None for no line
    (a state that ends nothing, or a repeat of the same state)."""
    if State(state) == State(previous):
        return None
    return END_LOG_LEVEL.get(State(state))


def is_active(state: State | str) -> bool:
    return State(state) in _ACTIVE
