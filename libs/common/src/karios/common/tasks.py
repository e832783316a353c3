"""Stopping background tasks reliably.

On CPython 3.11 a ``task.cancel()`` can be lost: ``asyncio.wait_for`` returns the inner
result and drops the cancellation when both arrive in the same loop turn (gh-86296, fixed by
the 3.12 rewrite of ``wait_for``). nats-py waits for every request reply with ``wait_for``,
so a loop cancelled while inside a NATS request may swallow the cancel and run on, and the
usual ``task.cancel(); await task`` then waits forever (seen: the SSE relay's watchdog hung
a gateway's shutdown). :func:`cancel_and_wait` cancels again until the task has ended.
"""

from __future__ import annotations

import asyncio

from karios.common.telemetry import get_logger

log = get_logger(__name__)


async def cancel_and_wait(*tasks: asyncio.Future[object] | None, grace: float = 1.0) -> None:
    """Cancel ``tasks`` (``None`` and finished ones are skipped) and return once all have ended.

    A task still running ``grace`` seconds after a cancel (it swallowed it, or is finishing a
    clean-up) is cancelled again, every ``grace`` seconds. Exceptions the tasks ended with are
    logged, not raised: the caller is stopping them. The calling task, if listed, is cancelled
    (it ends at its next ``await``) and not waited for.
    """
    me = asyncio.current_task()
    if me is not None and me in tasks:
        me.cancel()  # a task stopping itself ends at its next await; it cannot wait for itself
    pending = {t for t in tasks if t is not None and t is not me and not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _done, pending = await asyncio.wait(pending, timeout=grace)
    for t in tasks:
        if t is not None and t.done() and not t.cancelled() and t.exception() is not None:
            log.debug("stopped task had failed", task=repr(t), error=type(t.exception()).__name__)
