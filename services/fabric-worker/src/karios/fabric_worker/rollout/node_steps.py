"""How :class:`~.node.NodeRollout` runs its changing steps on a node (SSH): the commit as one
interruptible exec, the race against an abort, and bringing FRR's running configuration back to
the file after a reload (:mod:`.running` says whether it differs, this module acts on it)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from karios.common.tasks import cancel_and_wait
from karios.fabric_worker.rollout.errors import RolloutCancelled
from karios.fabric_worker.rollout.facts import RUNNING_CONFIG_COMMAND
from karios.fabric_worker.rollout.plan import FrrAction, FrrPlan, commit_script, frr_action_command
from karios.fabric_worker.rollout.running import RunningDiff, running_diff
from karios.fabric_worker.rollout.ssh import NodeSession
from karios.fabric_worker.rollout.steps import step_command

T = TypeVar("T")


async def apply_frr_plan(
    s: NodeSession,
    plan: FrrPlan,
    limit_s: float,
    *,
    fence: str = "",
    net: Sequence[str] = (),
    net_first: bool = True,
) -> None:
    """The link changes `net` and the FRR plan (write/delete the managed files, start/restart/
    reload/stop FRR; stop before writing) as ONE interruptible step (:func:`step_command`, one
    SSH exec): a cancel kills it, the rollback fences it."""
    script, data = commit_script(plan, net, net_first=net_first)
    if script:
        await s.run(step_command(script, fence=fence), input=data or None, limit_s=limit_s)


async def until_abort(work: Awaitable[T], abort: asyncio.Event | None, label: str) -> T:
    """Await `work`, or stop it the moment `abort` is set (whatever command it is waiting on:
    the SSH session closes; the rollback kills the interrupted step on the node)."""
    if abort is None:
        return await work
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this task itself was cancelled (worker stopping)
        task.cancel()
        raise
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    await cancel_and_wait(task, grace=0.5)
    raise RolloutCancelled(f"{label}: rollout aborted")


@dataclasses.dataclass(frozen=True)
class Converged:
    """The end of a reload: `restarted` when the reload left the running config different
    (`left`: what still differed) and FRR was restarted from the file."""

    restarted: bool = False
    left: RunningDiff = dataclasses.field(default_factory=RunningDiff)


async def converge_after_reload(s: NodeSession, rendered: str, *, fence: str, limit_s: float) -> Converged:
    """After ``frrinit.sh reload`` (FRR's ``frr-reload.py --reload``: only the difference is
    applied, no session is reset): read the running config again and, when it still differs from
    the rendered `rendered` frr.conf (a delta frr-reload cannot apply, a daemon that is down),
    restart FRR — the daemons then read the file itself. One exec when the reload converged."""
    out = await s.run(RUNNING_CONFIG_COMMAND, check=False, limit_s=limit_s)
    left = running_diff(rendered, out.stdout) if out.stdout.strip() else RunningDiff()
    if not left:
        return Converged()
    restart = frr_action_command(FrrAction.RESTART) or ""
    await s.run(step_command(restart, fence=fence), limit_s=limit_s)
    return Converged(restarted=True, left=left)
