"""Cached vs uncached host lookup latency against a real NetBox (tests/lab/netbox.sh).

    eval "$(tests/lab/netbox.sh up)"; export NETBOX_URL NETBOX_TOKEN
    uv run python benchmarks/inventory_lookup.py [--n 200]

Creates a device with 3 NICs through the API (deleted afterwards), then times
``Inventory.host(mac)``: uncached (cache cleared before every lookup: the NetBox round trips)
and cached (what a boot storm sees after the first request), plus 100 concurrent misses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import pynetbox
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*

from karios.common.cache import SingleFlightCache
from karios.inventory.lookups import Inventory, InventoryMetrics
from karios.inventory.netbox_store import NetBoxStore
from karios.inventory.store import parse_ident
from tests.lab.netbox_lab import NetBoxLab


def summary(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return f"n={len(ms)} p50={statistics.median(ms):.3f} ms p95={p95:.3f} ms max={ms[-1]:.3f} ms"


async def main(n: int) -> None:
    url, token = os.environ["NETBOX_URL"], os.environ["NETBOX_TOKEN"]
    lab = NetBoxLab(pynetbox.api(url, token=token))
    store = NetBoxStore(url, token)
    try:
        lab.shared()
        lab.base()
        dev = lab.device_with_items()
        inv = Inventory(store=store, cache=SingleFlightCache(), metrics=InventoryMetrics(CollectorRegistry()))
        ident = parse_ident(mac=dev.macs["eno1"])
        await inv.host(ident)  # warm connections
        uncached, cached = [], []
        for _ in range(n):
            inv.cache.clear()
            t = time.perf_counter()
            await inv.host(ident)
            uncached.append(time.perf_counter() - t)
        calls = store.calls
        for _ in range(n * 10):
            t = time.perf_counter()
            await inv.host(ident)
            cached.append(time.perf_counter() - t)
        assert store.calls == calls, "cached lookups must not reach NetBox"
        inv.cache.clear()
        before = store.calls
        t = time.perf_counter()
        await asyncio.gather(*(inv.host(ident) for _ in range(100)))
        storm = time.perf_counter() - t
        print(f"NetBox {url}  (device {dev.name})")
        print(f"uncached lookup by MAC : {summary(uncached)}  ({calls // (n + 1)} NetBox calls each)")
        print(f"cached lookup by MAC   : {summary(cached)}")
        print(f"100 concurrent misses  : {storm * 1000:.1f} ms total, {store.calls - before} NetBox calls")
    finally:
        await store.close()
        lab.cleanup()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100, help="uncached lookups (cached: 10x)")
    asyncio.run(main(ap.parse_args().n))
