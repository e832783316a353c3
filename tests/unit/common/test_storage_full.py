"""A full disk is a reported state (issue 24 item 5): the pure mapping of PostgreSQL's and
JetStream's "no room" errors to 503 ``STORAGE_FULL`` + ``Retry-After`` (never a 500), the alarm
behind ``/readyz``'s ``storage`` check, and its metrics. The real disk: the integration test
``tests/integration/chaos/test_disk_full.py``."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import httpx
import nats.js.errors
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest

from karios.common.bus.replies import answer_query
from karios.common.bus.runtime import Bus
from karios.common.bus.subjects import Subjects
from karios.common.contracts.inventory import RegisterNode
from karios.common.db.session import unavailable_database_error
from karios.common.errors import (
    ServiceUnavailable,
    StorageFull,
    error_from_dict,
    http_status_for,
    resource_error,
)
from karios.common.http import add_ops_routes, install_error_handlers
from karios.common.service import ServiceRuntime
from karios.common.settings import KariosSettings
from karios.common.storage import BUS_HOLD_S, StorageAlarm, StorageCollector

EXTEND = 'could not extend file "base/16384/16390": No space left on device'


class AdaptedError(Exception):
    """Stands in for SQLAlchemy's asyncpg adaptation (``sqlstate`` copied from the driver's error)."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _dbapi_error(orig: BaseException) -> sa.exc.DBAPIError:
    return sa.exc.DBAPIError("INSERT INTO inventory.bmc_infos VALUES ($1)", ("secret-param",), orig)


def _wrapped_disk_full() -> sa.exc.DBAPIError:
    """How it reaches a handler: DBAPIError → adapted error → asyncpg's DiskFullError (cause)."""
    adapted = AdaptedError(f"<class 'asyncpg.exceptions.DiskFullError'>: {EXTEND}", "53100")
    adapted.__cause__ = asyncpg.exceptions.DiskFullError(EXTEND)
    return _dbapi_error(adapted)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.DiskFullError(EXTEND),
        _dbapi_error(asyncpg.exceptions.DiskFullError(EXTEND)),
        _wrapped_disk_full(),
        AdaptedError('could not write to file "base/pgsql_tmp/x": No space left on device', "53100"),
    ],
    ids=["asyncpg", "dbapi-wrapped", "adapted-chain", "temp-file"],
)
def test_a_full_database_disk_is_503_storage_full(exc):
    err = unavailable_database_error(exc)
    assert isinstance(err, StorageFull) and err is not None
    assert err.code == "STORAGE_FULL" and err.retryable and http_status_for(err) == 503
    assert err.retry_after == 30 and err.details == {"store": "database"}
    assert "base/16384" not in err.message and "secret-param" not in err.message


@pytest.mark.parametrize("sqlstate", ["53000", "53200", "53400"])
def test_other_class_53_shortages_are_a_plain_503(sqlstate):
    err = resource_error(_dbapi_error(AdaptedError("out of shared memory", sqlstate)))
    assert type(err) is ServiceUnavailable and err.http_status == 503
    assert sqlstate in err.message


@pytest.mark.parametrize(
    "exc",
    [
        _dbapi_error(asyncpg.exceptions.UniqueViolationError("duplicate key")),
        _dbapi_error(AdaptedError("division by zero", "22012")),
        ValueError("53100"),
        OSError(28, "No space left on device"),  # the service's own disk: not a database answer
    ],
)
def test_other_errors_are_not_storage_errors(exc):
    assert resource_error(exc) is None


@pytest.mark.parametrize(
    ("exc", "full"),
    [
        (
            nats.js.errors.ServiceUnavailableError(
                code=503, err_code=10023, description="insufficient resources"
            ),
            True,
        ),
        (
            nats.js.errors.ServerError(
                code=500, err_code=10047, description="insufficient storage resources available"
            ),
            True,
        ),
        (
            nats.js.errors.BadRequestError(
                code=400, err_code=10002, description="resource limits exceeded for account"
            ),
            True,
        ),
        (
            nats.js.errors.ServiceUnavailableError(
                code=503, err_code=10077, description="maximum bytes exceeded"
            ),
            True,
        ),
        (
            nats.js.errors.ServiceUnavailableError(
                code=503, err_code=10077, description="write /data/jetstream/x.blk: no space left on device"
            ),
            True,
        ),
        (
            nats.js.errors.ServiceUnavailableError(code=503, err_code=10077, description="store is closed"),
            False,
        ),
        (
            nats.js.errors.ServiceUnavailableError(
                code=503, err_code=10008, description="JetStream system temporarily unavailable"
            ),
            False,
        ),
        (nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found"), False),
    ],
)
def test_jetstream_store_errors(exc, full):
    err = resource_error(exc)
    if full:
        assert isinstance(err, StorageFull) and err.details == {"store": "bus"}
    else:
        assert err is None


def test_storage_full_crosses_the_bus_and_keeps_its_retry_after():
    body = StorageFull("the database's disk is full", details={"store": "database"}).to_dict()
    err = error_from_dict(json.loads(json.dumps(body)))
    assert isinstance(err, StorageFull) and http_status_for(err) == 503 and err.retry_after == 30


async def test_a_query_handler_on_a_full_disk_answers_storage_full():
    async def handler(_cmd: Any) -> None:
        raise _wrapped_disk_full()

    reply = await answer_query(json.dumps({"bmc_ip": "10.0.0.1"}).encode(), RegisterNode, handler)
    assert not reply.ok and reply.error is not None
    assert reply.error.code == "STORAGE_FULL" and reply.error.retryable
    assert "secret-param" not in reply.model_dump_json() and "base/16384" not in reply.model_dump_json()


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/write")
    async def write() -> None:
        raise _wrapped_disk_full()  # no handler takes it: the last-resort mapping

    @app.post("/remote")
    async def remote() -> None:
        raise error_from_dict(StorageFull("the database's disk is full").to_dict())

    return app


async def test_http_answers_503_storage_full_with_retry_after_never_500():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as c:
        for path in ("/write", "/remote"):
            r = await c.post(path)
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "STORAGE_FULL" and r.json()["retryable"] is True
            assert r.headers["Retry-After"] == "30"
            for leak in ("secret-param", "INSERT", "DiskFullError", "base/16384"):
                assert leak not in r.text


# -- the alarm ------------------------------------------------------------------------------
def test_alarm_episode_reason_and_clearing():
    alarm = StorageAlarm("database")
    assert not alarm.active and alarm.reason() is None
    alarm.record_full(now=1_700_000_000)
    alarm.record_full(now=1_700_000_005)
    assert alarm.active and alarm.since == 1_700_000_000 and alarm.failures == 2
    reason = alarm.reason()
    assert reason is not None and "disk is full" in reason and "2023-11-14T22:13:20Z" in reason
    alarm.record_ok()
    assert not alarm.active and alarm.failures == 2  # the counter never goes down


def test_bus_alarm_expires_after_the_hold_with_no_new_refusal():
    alarm = StorageAlarm("bus")
    alarm.record_full(now=100.0)
    alarm.expire(BUS_HOLD_S, now=100.0 + BUS_HOLD_S - 1)
    assert alarm.active
    alarm.expire(BUS_HOLD_S, now=100.0 + BUS_HOLD_S)
    assert not alarm.active


def test_metrics_gauge_and_counter_per_store():
    db, bus = StorageAlarm("database"), StorageAlarm("bus")
    registry = CollectorRegistry()
    registry.register(StorageCollector([bus, db]))
    db.record_full()
    text = generate_latest(registry).decode()
    assert 'karios_storage_full{store="database"} 1.0' in text
    assert 'karios_storage_full{store="bus"} 0.0' in text
    assert 'karios_storage_full_errors_total{store="database"} 1.0' in text
    db.record_ok()
    assert 'karios_storage_full{store="database"} 0.0' in generate_latest(registry).decode()


# -- publishing to a full stream -----------------------------------------------------------
class _FakeJs:
    def __init__(self) -> None:
        self.error: BaseException | None = None

    async def publish(self, *_a: Any, **_kw: Any) -> Any:
        if self.error is not None:
            raise self.error
        return {"stream": "T_EVT", "seq": 1}


class _Nc:
    is_connected = True


class _OfflineBus(Bus):
    """A Bus whose JetStream client is a stand-in (no server)."""

    fake: _FakeJs

    @property
    def nc(self) -> Any:
        return _Nc()

    @property
    def js(self) -> Any:
        return self.fake


async def test_a_refused_publish_is_storage_full_and_the_next_stored_one_clears_it():
    bus = _OfflineBus(service="unit", servers=["nats://127.0.0.1:1"], subjects=Subjects("t"))
    bus.fake = _FakeJs()
    event = RegisterNode(bmc_ip="10.0.0.1")  # any contract: the payload is not looked at
    bus.fake.error = nats.js.errors.ServerError(
        code=500, err_code=10047, description="insufficient storage resources available"
    )
    with pytest.raises(StorageFull):
        await bus.send_command(event, "t.cmd.x")
    assert bus.storage.active and bus.storage.failures == 1
    # A 503 that is not a full store stays a plain SERVICE_UNAVAILABLE (and leaves the alarm).
    bus.fake.error = nats.js.errors.ServiceUnavailableError(code=503, err_code=10008, description="busy")
    with pytest.raises(ServiceUnavailable) as caught:
        await bus.send_command(event, "t.cmd.x")
    assert type(caught.value) is ServiceUnavailable and bus.storage.failures == 1
    bus.fake.error = None
    await bus.send_command(event, "t.cmd.x")
    assert not bus.storage.active


# -- readiness -------------------------------------------------------------------------------
async def test_readyz_names_the_reason_of_a_failing_check_only():
    app = FastAPI()
    checks = {"bus": True, "database": True, "storage": False}

    async def ready() -> dict[str, bool]:
        return dict(checks)

    def reasons() -> dict[str, str]:
        return {"storage": "the database's disk is full", "other": "not a check"}

    add_ops_routes(app, ready, CollectorRegistry(), reasons=reasons)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert r.json()["reasons"] == {"storage": "the database's disk is full"}
        checks["storage"] = True
        r = await c.get("/readyz")
        assert r.status_code == 200 and "reasons" not in r.json()


async def test_runtime_storage_check_probes_the_database_and_expires_the_bus():
    settings = KariosSettings(dev_mode=True, database_url="postgresql+asyncpg://u@127.0.0.1:1/none")
    rt = ServiceRuntime("storage-unit", settings, schema="unit")
    assert rt.db is not None
    probes: list[bool] = []
    room = False

    async def probe_write(timeout: float = 1.5) -> bool:
        probes.append(room)
        if room:
            rt.db.storage.record_ok()  # type: ignore[union-attr]
        return room

    rt.db.probe_write = probe_write  # type: ignore[method-assign]
    assert await rt.storage_ok() and probes == []  # no alarm: no probe write
    rt.db.storage.record_full()
    assert not await rt.storage_ok() and probes == [False]
    assert "disk is full" in rt.not_ready_reasons()["storage"]
    room = True
    assert await rt.storage_ok() and probes == [False, True]
    assert rt.not_ready_reasons() == {}
    rt.bus.storage.record_full(now=time.time() - BUS_HOLD_S - 1)  # refused long ago
    assert await rt.storage_ok()
    rt.bus.storage.record_full()
    assert not await rt.storage_ok() and "message store" in rt.not_ready_reasons()["storage"]
    await rt.db.close()
