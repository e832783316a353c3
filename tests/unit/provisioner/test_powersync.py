"""Power-state sync, the pure parts: pacing of the reads and the name of a change."""

from __future__ import annotations

import asyncio

from karios.provisioner.bmc.powersync import change_of, paced


async def test_reads_start_at_most_rate_per_second_and_concurrency_at_once() -> None:
    now = [0.0]
    started: list[tuple[str, float]] = []
    running, peak = [0], [0]

    async def sleep(s: float) -> None:
        now[0] += s
        await asyncio.sleep(0)

    async def work(item: str) -> None:
        started.append((item, now[0]))
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0)
        running[0] -= 1

    at = await paced(
        [f"b{i}" for i in range(10)], 4.0, work, concurrency=2, sleep=sleep, clock=lambda: now[0]
    )
    assert [i for i, _ in started] == [f"b{i}" for i in range(10)]  # each read once, in order
    assert at == [i * 0.25 for i in range(10)]  # 4 per second, no faster
    assert 1 <= peak[0] <= 2


def test_change_names() -> None:
    assert change_of("On", "Off") == "powered_off"
    assert change_of("Off", "On") == "powered_on"
    assert change_of("On", "PoweringOff") == "other"
