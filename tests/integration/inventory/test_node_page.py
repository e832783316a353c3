"""``GET /controlnode/nodes`` pages in SQL (benchmarks/hot_paths.py: 10,000 nodes): every page and
every single-node lookup is what the whole node set (``compute.node_set``) sliced in Python gives —
same order (IPv4 before IPv6, numerically), same pairing of compute and registry rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from karios.common.db import Database
from karios.common.db.migrate import upgrade
from karios.inventory import compute
from karios.inventory.models import SCHEMA, BmcInfo, ComputeNodeRow

pytestmark = pytest.mark.integration

MIGRATIONS = Path(compute.__file__).parent / "migrations"


def _key(pair):  # type: ignore[no-untyped-def]
    c, b = pair
    return (c.node_ip if c else None, b.bmc_ip if b else None)


async def test_pages_and_lookups_equal_the_whole_set_sliced(database_url: str):
    await asyncio.to_thread(upgrade, MIGRATIONS, database_url, SCHEMA)
    db = Database(database_url)
    try:
        async with db.session() as s, s.begin():
            # Numeric order differs from text order (10.77.0.9 < 10.77.0.10), an IPv6 node, a
            # registry row and a compute row on the same address (the compute row wins, linked).
            for i in (9, 10, 100, 2):
                s.add(BmcInfo(bmc_ip=f"10.76.0.{i}", os_ip=f"10.77.0.{i}"))
            s.add(BmcInfo(bmc_ip="10.76.1.1", os_ip="2001:db8::7"))
            s.add(BmcInfo(bmc_ip="10.76.1.2"))  # no OS address: not a node
            s.add(ComputeNodeRow(node_ip="10.77.0.10", source="adopted", bmc_ip="10.76.0.10"))
            s.add(ComputeNodeRow(node_ip="10.77.0.50", source="adopted"))
        async with db.session() as s:
            whole = await compute.node_set(s)
            assert ("10.77.0.10", "10.76.0.10") in [_key(p) for p in whole]
            ips = [compute.to_view(p).node_ip for p in whole]
            assert ips.index("10.77.0.9") < ips.index("10.77.0.10") < ips.index("2001:db8::7")
            for limit in (1, 2, 3, 100):
                for offset in range(0, len(whole) + 2):
                    page, total = await compute.node_page(s, offset, limit)
                    assert total == len(whole)
                    assert [_key(p) for p in page] == [_key(p) for p in whole[offset : offset + limit]]
            for pair in whole:
                ip = compute.to_view(pair).node_ip
                found = await compute.node_of(s, ip)
                assert found is not None and _key(found) == _key(pair)
            assert await compute.node_of(s, "10.77.9.9") is None
    finally:
        await db.close()
