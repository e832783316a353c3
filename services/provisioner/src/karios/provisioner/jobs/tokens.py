"""Pure: which installer callback a job token is good for, in which state, how many times.

A job token is bound to its job's life (Ironic's agent-token model). The boot medium carries it;
the installer and then the installed system use it, each for what it has to say:

============  ========================================  =====================================
callback      job state                                 also needs
============  ========================================  =====================================
step          booting, installing, stuck                /complete not yet accepted
complete      booting, installing, stuck                /complete not yet accepted (once)
firstboot     first_boot, stuck                         a provision job whose /complete was
                                                        accepted at most ``window`` seconds ago;
                                                        accepted once (it ends the job)
============  ========================================  =====================================

Every other pair is refused (409), in particular every callback of a completed, failed or
cancelled job, a step or a second /complete after /complete, and a /firstboot before /complete,
of an unprovision job, or after its window. ``installed_at`` (when /complete was accepted) is the
job's memory of "/complete happened": a stuck job may have been either side of it.

No I/O: :func:`refusal` is the rule, :func:`check` raises it, :func:`target` is the state an
accepted callback moves the job to (the use cases in :mod:`.callbacks` do the moving).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from karios.common.errors import Conflict
from karios.provisioner.statemachine import State, is_terminal


class Callback(enum.StrEnum):
    step = "step"
    complete = "complete"
    firstboot = "firstboot"


S = State
# The states in which a token is good for a callback (before the conditions on /complete).
ACCEPTS: dict[Callback, frozenset[State]] = {
    Callback.step: frozenset({S.booting, S.installing, S.stuck}),
    Callback.complete: frozenset({S.booting, S.installing, S.stuck}),
    Callback.firstboot: frozenset({S.first_boot, S.stuck}),
}
# Accepted at most once per job: /complete records ``installed_at``, /firstboot ends the job.
ONCE = frozenset({Callback.complete, Callback.firstboot})
DEFAULT_FIRSTBOOT_WINDOW = 3600.0  # seconds after /complete (KARIOS_PROVISIONER_FIRSTBOOT_WINDOW)


@dataclass(frozen=True)
class TokenState:
    """What the rule reads of a job."""

    job_id: str
    state: State
    job_type: str = "provision"
    installed_at: datetime | None = None  # when /complete was accepted (None: not yet)

    @classmethod
    def of(cls, job: object) -> TokenState:
        """From a job row (anything with ``id``, ``state``, ``job_type``, ``installed_at``)."""
        return cls(
            job_id=job.id,  # type: ignore[attr-defined]
            state=State(job.state),  # type: ignore[attr-defined]
            job_type=job.job_type or "provision",  # type: ignore[attr-defined]
            installed_at=job.installed_at,  # type: ignore[attr-defined]
        )


def refusal(cb: Callback | str, job: TokenState, now: datetime, window: float) -> str | None:
    """Why ``job``'s token may not make callback ``cb`` now, or None when it may."""
    cb = Callback(cb)
    head = f"job {job.job_id} is {job.state.value}"
    if is_terminal(job.state):
        return f"{head}: its token no longer accepts /{cb.value}"
    if cb is not Callback.firstboot:
        if job.installed_at is not None:
            return f"{head}: the installer already reported /complete; its token no longer accepts /{cb}"
        if job.state not in ACCEPTS[cb]:
            return f"{head} and has not booted its installer: its token does not accept /{cb} yet"
        return None
    if job.job_type == "unprovision":
        return f"job {job.job_id} is an unprovision job: there is no first boot to report"
    if job.installed_at is None or job.state not in ACCEPTS[cb]:
        return f"{head} and has not finished installing: its token does not accept /firstboot yet"
    closed = job.installed_at + timedelta(seconds=window)
    if now > closed:
        return (
            f"{head}: its /firstboot window closed at {closed.isoformat(timespec='seconds')} "
            f"({window:g} s after /complete); an operator must register the node"
        )
    return None


def check(cb: Callback | str, job: TokenState, now: datetime, window: float) -> None:
    """:class:`Conflict` (409) naming why, when the token may not make ``cb`` now."""
    why = refusal(cb, job, now, window)
    if why is not None:
        raise Conflict(why, details={"job_id": job.job_id, "state": job.state.value, "callback": str(cb)})


def target(cb: Callback | str, job_type: str, failed: bool = False) -> State:
    """The state an accepted callback moves its job to (an unprovision's /complete ends it)."""
    cb = Callback(cb)
    if cb is Callback.step:
        return S.failed if failed else S.installing
    if cb is Callback.complete:
        return S.completed if job_type == "unprovision" else S.first_boot
    return S.completed
