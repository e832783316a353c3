"""GET /controlnode/provision/queue reads the provisioner's queue a page at a time: one bus reply
is one NATS message (1 MB by default), and a 10,000-job storm's queue (~2 MB) did not fit."""

from __future__ import annotations

from typing import Any

from karios.api_gateway.routes.provision import _queue_entries
from karios.common.bus.subjects import Subjects
from karios.common.contracts.provision import QUEUE_PAGE, QueueQuery


class PagedBus:
    """The provisioner's side of the queue query over a list that may change between pages."""

    def __init__(self, entries: list[dict[str, Any]], between=None) -> None:  # type: ignore[no-untyped-def]
        self.entries, self.between, self.asked = entries, between, []
        self.subjects = Subjects("unitgw")

    async def request(self, subject: str, q: QueueQuery) -> list[dict[str, Any]]:
        assert subject == self.subjects.query("provision", "queue")
        self.asked.append((q.offset, q.limit))
        page = self.entries[q.offset : q.offset + q.limit] if q.limit else self.entries[q.offset :]
        if self.between:
            self.between(self)
        return page


def entries(n: int) -> list[dict[str, Any]]:
    return [{"job_id": f"j{i}", "position": i + 1} for i in range(n)]


async def test_a_queue_longer_than_a_page_comes_whole_in_pages():
    n = 2 * QUEUE_PAGE + 7
    bus = PagedBus(entries(n))
    got = await _queue_entries(bus)  # type: ignore[arg-type]
    assert [e["job_id"] for e in got] == [f"j{i}" for i in range(n)]
    assert bus.asked == [(0, QUEUE_PAGE), (QUEUE_PAGE, QUEUE_PAGE), (2 * QUEUE_PAGE, QUEUE_PAGE)]


async def test_an_exact_multiple_of_the_page_asks_once_more_and_a_short_queue_once():
    bus = PagedBus(entries(QUEUE_PAGE))
    assert len(await _queue_entries(bus)) == QUEUE_PAGE  # type: ignore[arg-type]
    assert len(bus.asked) == 2  # the second answers nothing: the end
    bus = PagedBus(entries(3))
    assert len(await _queue_entries(bus)) == 3 and bus.asked == [(0, QUEUE_PAGE)]  # type: ignore[arg-type]


async def test_a_job_that_moves_between_two_pages_is_listed_once():
    def admit_one(bus: PagedBus) -> None:
        if len(bus.asked) == 1:  # after the first page, a job ahead leaves the queue...
            bus.entries.pop(0)
            bus.entries.insert(QUEUE_PAGE, {"job_id": "j1", "position": 0})  # ...and one is seen again

    bus = PagedBus(entries(QUEUE_PAGE + 10), between=admit_one)
    got = await _queue_entries(bus)  # type: ignore[arg-type]
    ids = [e["job_id"] for e in got]
    assert len(ids) == len(set(ids))
