"""cancel_and_wait ends a task even when the task swallows a cancel (CPython 3.11's wait_for
drops a cancel that lands in the same loop turn as the inner result, gh-86296)."""

from __future__ import annotations

import asyncio

from karios.common.tasks import cancel_and_wait


async def test_a_loop_that_swallows_the_first_cancel_is_stopped() -> None:
    swallowed = 0

    async def loop() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed == 0:  # what wait_for does when the reply arrived in the same turn
                    swallowed += 1
                    continue
                raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, grace=0.05), timeout=5)
    assert task.cancelled()
    assert swallowed == 1


async def test_none_finished_and_failed_tasks_are_accepted() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fail())
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    await cancel_and_wait(None, failed, done)  # never raises the task's own error
    assert failed.done() and isinstance(failed.exception(), RuntimeError)
    assert done.done() and not done.cancelled()


async def test_a_task_finishing_its_clean_up_gets_the_grace_before_another_cancel() -> None:
    finished = asyncio.Event()

    async def cleanup_on_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # shorter than the grace: not interrupted
            finished.set()
            raise

    task = asyncio.create_task(cleanup_on_cancel())
    await asyncio.sleep(0)
    await cancel_and_wait(task, grace=1.0)
    assert finished.is_set()


async def test_a_task_stopping_itself_is_cancelled_not_awaited() -> None:
    async def stop_myself() -> None:
        await cancel_and_wait(asyncio.current_task())
        await asyncio.sleep(3600)  # the cancel lands here

    task = asyncio.create_task(stop_myself())
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled()
