"""Fault handling rules: crash-loop policy, reconnect backoff, safe errors, database unavailability."""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from karios.cli.supervisor import CrashPolicy
from karios.common.bus.connection import RECONNECT_MAX_S, reconnect_backoff
from karios.common.db.session import DatabaseUnreachable, unavailable_database_error
from karios.common.errors import (
    InternalError,
    NotFound,
    ServiceUnavailable,
    describe_for_log,
    public_error,
)
from karios.common.http import install_error_handlers

SECRET = "ciphertext-9f8e7d-secret"


class QueryCanceledError(Exception):
    """Stands in for asyncpg's error of that name (matched by name: no driver import needed)."""


def _dbapi_error(orig: Exception) -> sa.exc.DBAPIError:
    return sa.exc.DBAPIError("UPDATE jobs SET token_hash=$1 WHERE id=$2", (SECRET, "j-1"), orig)


def test_crash_policy_backs_off_then_gives_up_within_the_window():
    policy = CrashPolicy(max_crashes=5, window=60, first_delay=0.5, max_delay=10)
    assert [policy.crashed(t) for t in (0, 1, 2, 3)] == [0.5, 1.0, 2.0, 4.0]
    assert policy.crashed(4) is None  # 5 crashes within 60 s


def test_crash_policy_forgets_old_crashes_and_caps_the_delay():
    policy = CrashPolicy(max_crashes=3, window=10, first_delay=4, max_delay=6)
    assert policy.crashed(0) == 4 and policy.crashed(5) == 6  # capped
    assert policy.crashed(100) == 4  # the earlier two are outside the window: restarted forever
    assert policy.recent == 1


def test_reconnect_backoff_grows_to_a_cap_with_jitter():
    class S:
        def __init__(self, n: int) -> None:
            self.reconnects = n

    first = [reconnect_backoff([S(0)], {})[1] for _ in range(50)]
    late = [reconnect_backoff([S(40)], {})[1] for _ in range(50)]
    assert all(0.05 < d < 0.2 for d in first)
    assert all(RECONNECT_MAX_S * 0.8 <= d <= RECONNECT_MAX_S * 1.2 for d in late)
    assert reconnect_backoff([S(3)], {})[0] is None  # the client keeps choosing the server


def test_log_description_keeps_the_statement_but_never_the_parameters():
    err = _dbapi_error(ValueError(f"value too long\nDETAIL: Key (token_hash)=({SECRET}) exists"))
    text = describe_for_log(err)
    assert SECRET not in text and "j-1" not in text
    assert "value too long" in text and "UPDATE jobs" in text
    assert SECRET in str(err)  # what SQLAlchemy itself would have printed


def test_public_error_is_opaque_for_anything_but_a_karios_error():
    hidden = public_error(_dbapi_error(ValueError(SECRET)))
    assert isinstance(hidden, InternalError) and hidden.code == "INTERNAL"
    assert SECRET not in hidden.message and "Error" not in hidden.message.split(":")[0]
    shown = NotFound("no job j-1")
    assert public_error(shown) is shown


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError(),
        TimeoutError(),
        sa.exc.TimeoutError("QueuePool limit reached"),
        ConnectionRefusedError(),
        _dbapi_error(QueryCanceledError("canceling statement due to statement timeout")),
        sa.exc.OperationalError("SELECT 1", {}, OSError("connection lost")),
        DatabaseUnreachable("database unreachable: No such file or directory"),
    ],
)
def test_stalled_or_unreachable_database_is_503(exc):
    err = unavailable_database_error(exc)
    assert isinstance(err, ServiceUnavailable) and err.http_status == 503


@pytest.mark.parametrize(
    # A FileNotFoundError outside a connect (a missing template, say) is a bug, not the database.
    "exc",
    [ValueError("bad"), _dbapi_error(ValueError("value too long")), KeyError("x"), FileNotFoundError(2, "x")],
)
def test_a_real_bug_is_not_disguised_as_unavailability(exc):
    assert unavailable_database_error(exc) is None


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/bug")
    async def bug() -> None:
        raise _dbapi_error(ValueError(f"duplicate key {SECRET}"))

    @app.get("/stalled")
    async def stalled() -> None:
        raise TimeoutError

    @app.get("/busy")
    async def busy() -> None:
        raise ServiceUnavailable("the message bus is unavailable; try again shortly")

    return app


async def test_error_responses_name_no_exception_class_sql_or_parameter():
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.get("/bug")
        assert r.status_code == 500
        assert r.json()["code"] == "INTERNAL" and r.json()["message"]
        for leak in (SECRET, "DBAPIError", "ValueError", "UPDATE", "Traceback"):
            assert leak not in r.text
        r = await c.get("/stalled")
        assert r.status_code == 503 and r.json()["code"] == "SERVICE_UNAVAILABLE"
        assert r.headers["Retry-After"] == "2" and "TimeoutError" not in r.text
        r = await c.get("/busy")
        assert r.status_code == 503 and r.headers["Retry-After"] == "2"
        assert r.json()["message"] == "the message bus is unavailable; try again shortly"
