"""One replica follows NetBox's change log: a PostgreSQL session advisory lock on the real server.
Two followers share a database; only the holder reads the log; when it stops (or its connection
dies) the other takes over, starting with one drop-everything event."""

from __future__ import annotations

import pytest

from karios.common.contracts.inventory import DeviceChanged
from karios.common.db import Database
from karios.inventory.changelog import ChangeLogFollower, PgLeaderLock

pytestmark = pytest.mark.integration


class Log:
    """A change log of fixed records; counts reads per follower."""

    def __init__(self) -> None:
        self.records = [{"id": 5, "changed_object_type": "dcim.device", "changed_object_id": 1}]
        self.reads = 0

    async def latest_change_id(self) -> int:
        self.reads += 1
        return max(r["id"] for r in self.records)

    async def changes_after(self, cursor: int, limit: int = 500) -> list[dict]:
        self.reads += 1
        return [r for r in self.records if r["id"] > cursor][:limit]

    async def devices_of_interfaces(self, ids: list[int]) -> dict[int, tuple[int, str]]:
        return {}


@pytest.fixture
async def db(database_url):
    d = Database(database_url)
    yield d
    await d.close()


async def test_only_the_lock_holder_polls_and_the_other_takes_over(db):
    logs, seen = (Log(), Log()), ([], [])

    def emitter(i: int):  # type: ignore[no-untyped-def]
        async def emit(evt: DeviceChanged) -> None:
            seen[i].append(evt)

        return emit

    a = ChangeLogFollower(logs[0], emitter(0), lock=PgLeaderLock(db))
    b = ChangeLogFollower(logs[1], emitter(1), lock=PgLeaderLock(db))
    try:
        assert await a.tick() == 1 and seen[0] == [DeviceChanged()]
        assert await b.tick() == 0 and logs[1].reads == 0 and b.cursor is None
        logs[0].records.append({"id": 6, "changed_object_type": "dcim.device", "changed_object_id": 2})
        assert await a.tick() == 1 and seen[0][-1].device_id == 2
        assert await b.tick() == 0 and logs[1].reads == 0

        await a.stop()  # closing its session releases the lock
        assert await b.tick() == 1 and seen[1] == [DeviceChanged()] and b.cursor == 5
        assert await a.tick() == 0 and a.cursor is None  # a restarted replica waits its turn
    finally:
        await a.stop()
        await b.stop()


async def test_a_dead_leader_connection_loses_leadership(db):
    lock = PgLeaderLock(db)
    assert await lock.ensure()
    assert lock._conn is not None
    raw = await lock._conn.get_raw_connection()
    await raw.driver_connection.close()  # the session is gone: PostgreSQL drops its locks
    assert await lock.ensure() is False
    other = PgLeaderLock(db)
    assert await other.ensure()
    await other.release()
    await lock.release()
