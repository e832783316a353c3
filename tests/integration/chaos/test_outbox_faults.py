"""Faults between the gateway's commit and the relay of its command (issue 12 item 4, ADR 0002).

- The gateway process SIGKILLed right after the commit (the chaos hook
  ``KARIOS_CHAOS_KILL_AFTER_OUTBOX_COMMIT``), before any relay: the restarted gateway relays the
  command once and the job runs on the Redfish emulator.
- NATS stopped while provisions are being committed (their INSERTs are held on a table lock
  until NATS is down, so the relay deterministically meets a dead bus): 202, the commands wait
  in the outbox, provisions sent during the outage get 503 (the BMC check needs the bus), and
  after NATS returns every accepted command is relayed once, none lost.

Real NATS (a private nats-server for the outage), PostgreSQL, inventory and provisioner; the
gateway runs as ``karios run api-gateway`` (its own process) for the SIGKILL case.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import nats
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.outbox import KILL_AFTER_COMMIT_ENV
from karios.api_gateway.readmodel import NEVER_REACHED
from karios.common.contracts.provision import StartProvision
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN, RunningApp, free_port, start_app
from tests.fixtures.chaos import PrivateNats, http_get, state_dir
from tests.fixtures.provision import retire_leftover_jobs, use_installer_media, wait_job, write_inventory
from tests.fixtures.wait import wait_until
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]
KILLED_BMC = "10.95.0.1"
OUTAGE_BMCS = [f"10.95.1.{i}" for i in range(1, 6)]
WORKED = {"failed", "cancelled", "building", "mounting", "booting", "installing"}
REFUSED_BMCS = [f"10.95.2.{i}" for i in range(1, 4)]


def _provisioner_cfg(tmp: Path, endpoints: dict) -> ProvisionerConfig:
    return ProvisionerConfig(
        cache_dir=Path(tempfile.gettempdir()) / "karios-test-media-cache",
        media_dir=tmp / "media",
        images_dir=tmp / "images",
        stage_deadline=600,
        stuck_check_interval=0.5,
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=15,
        power_deadline=20,
        build_concurrency=2,
        install_method="preseed",
        lease_seconds=3,
        claim_interval=0.3,
        bmc_endpoints=endpoints,
    )


async def _scalar(url: str, sql: str, **params) -> object:  # type: ignore[no-untyped-def]
    engine = create_async_engine(url)
    try:
        async with engine.connect() as c:
            return (await c.execute(sa.text(sql), params)).scalar()
    finally:
        await engine.dispose()


async def _outbox_rows(url: str) -> int:
    return int(await _scalar(url, "SELECT count(*) FROM gateway.command_outbox"))  # type: ignore[arg-type]


class GatewayProcess:
    """``python -m karios.cli run api-gateway`` on a chosen port, as production runs it."""

    def __init__(self, settings, port: int, log: Path, **env: str) -> None:  # type: ignore[no-untyped-def]
        base = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
        base.update(
            KARIOS_DEV_MODE="1",
            KARIOS_NATS_URL=settings.nats_url,
            KARIOS_DATABASE_URL=settings.database_url,
            KARIOS_BUS_PREFIX=settings.bus_prefix,
            KARIOS_BOOTSTRAP_ADMIN_TOKEN="kt_test-admin-token",
            KARIOS_LOG_JSON="false",
            **env,
        )
        self.url = f"http://127.0.0.1:{port}"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "karios.cli", "run", "api-gateway", "--port", str(port)],
                env=base,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def ready(self) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the gateway exited ({self.proc.returncode})")
            return http_get(f"{self.url}/readyz", timeout=2)[0] == 200

        await wait_until(lambda: asyncio.to_thread(up), timeout=90, interval=0.3, what="gateway ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.mark.timeout(300)
async def test_gateway_killed_between_commit_and_relay_delivers_once_after_restart(settings, serve, tmp_path):
    await retire_leftover_jobs(settings.database_url)
    inventory = write_inventory(tmp_path / "inventory.yaml", [KILLED_BMC])
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    try:
        emu = RedfishEmulator([fake_system("killed1")], auth=True).start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    port = free_port()
    endpoint = {"url": emu.url, "system_id": emu.system_ids[0]}
    endpoint |= {"username": emu.username, "password": emu.password}
    cfg = _provisioner_cfg(tmp_path, {KILLED_BMC: endpoint})
    cfg.callback_url = f"http://127.0.0.1:{port}"
    prov_app = provisioner_app(settings, cfg)
    use_installer_media(prov_app.state.jobs)
    prov = await serve(prov_app)
    cfg.media_url = prov.url
    subject = f"{settings.bus_prefix}.cmd.provision.start"
    published: Counter[str] = Counter()
    nc = await nats.connect(settings.nats_url)

    async def count(msg) -> None:  # type: ignore[no-untyped-def]
        published[(msg.headers or {}).get("Nats-Msg-Id", "")] += 1

    await nc.subscribe(subject, cb=count)
    log = tmp_path / "gateway.log"
    first = GatewayProcess(settings, port, log, **{KILL_AFTER_COMMIT_ENV: "1"})
    second = None
    try:
        await first.ready()
        body = {"bmc_IP": KILLED_BMC, "vendor": "dell", "hostname": "killed1"}
        async with httpx.AsyncClient(base_url=first.url, timeout=30) as c:
            with pytest.raises(httpx.TransportError):  # no answer: the process died mid-request
                await c.post("/controlnode/provision/dell", json=body, headers=ADMIN)
        assert await asyncio.to_thread(first.proc.wait, 10) == -signal.SIGKILL
        job = await _scalar(
            settings.database_url,
            "SELECT id FROM gateway.jobs WHERE bmc_ip = :ip AND job_status = 'queued'",
            ip=KILLED_BMC,
        )
        assert job, "the job row was committed before the kill"
        waiting = await _scalar(
            settings.database_url,
            "SELECT count(*) FROM gateway.command_outbox WHERE headers->>'karios-msg-id' = :id",
            id=job,
        )
        assert waiting == 1, "its command was committed with it, not yet relayed"
        await nc.flush()
        assert published[str(job)] == 0, "nothing was published before the kill"

        t0 = time.monotonic()
        second = GatewayProcess(settings, port, log)
        await second.ready()
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as c:
            got = await wait_job(c, str(job), {"building", "mounting", "booting", "installing"}, timeout=120)
            ran_after = time.monotonic() - t0
            assert await _outbox_rows(settings.database_url) == 0
            await nc.flush()
            assert published[str(job)] == 1, published
            await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)
        print(
            f"gateway SIGKILLed after commit: after restart the command was published "
            f"{published[str(job)]}x and the job reached {got['job_status']} {ran_after:.1f} s later"
        )
    finally:
        await nc.close()
        for gw in (first, second):
            if gw is not None:
                await asyncio.to_thread(gw.stop)
        emu.stop()


async def _lock_waiters(url: str) -> int:
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO gateway.jobs%'"
    )
    return int(await _scalar(url, sql))  # type: ignore[arg-type]


@pytest.mark.timeout(300)
async def test_nats_outage_commands_wait_in_the_outbox_and_are_relayed_once(settings, tmp_path):
    await retire_leftover_jobs(settings.database_url)
    running: list[RunningApp] = []
    with state_dir("karios-outbox-") as root:
        priv = PrivateNats(root)
        await asyncio.to_thread(priv.start)
        # db_command_timeout: the held INSERTs wait on the test's lock, longer than the default 5 s.
        s = settings.model_copy(update={"nats_url": priv.url, "db_command_timeout": 30.0})
        inventory = write_inventory(tmp_path / "inventory.yaml", OUTAGE_BMCS + REFUSED_BMCS)
        try:
            running.append(await start_app(inventory_app(s.model_copy(update={"inventory_file": inventory}))))
            # BMCs nobody answers (a closed port): the provisioner works each job and fails it with
            # its BMC's reason, which proves the command reached it.
            closed = {"url": f"https://127.0.0.1:{free_port()}", "username": "u", "password": "p"}
            cfg = _provisioner_cfg(tmp_path, dict.fromkeys(OUTAGE_BMCS, closed))
            running.append(await start_app(provisioner_app(s, cfg)))
            gw_app = gateway_app(s)
            running.append(await start_app(gw_app))
            await _outage_run(s, priv, gw_app, running[-1].url)
        finally:
            for app in reversed(running):  # before NATS goes: a bus stops cleanly only when connected
                await app.stop()
            await asyncio.to_thread(priv.stop)


async def _outage_run(s, priv: PrivateNats, gw_app, url: str) -> None:  # type: ignore[no-untyped-def]
    outbox = gw_app.state.outbox
    relayed: Counter[str] = Counter()
    after_relay = outbox.on_relayed

    async def counting(cmd) -> None:  # type: ignore[no-untyped-def]
        relayed[cmd.job_id] += 1
        await after_relay(cmd)

    outbox.on_relayed = counting
    engine = create_async_engine(s.database_url)
    async with httpx.AsyncClient(base_url=url, timeout=60) as c, engine.connect() as lock:
        tx = await lock.begin()
        await lock.execute(sa.text("LOCK TABLE gateway.jobs IN SHARE ROW EXCLUSIVE MODE"))
        body = {"vendor": "dell", "hostname": "n1"}
        sent = [
            asyncio.create_task(
                c.post("/controlnode/provision/dell", json={**body, "bmc_IP": ip}, headers=ADMIN)
            )
            for ip in OUTAGE_BMCS
        ]
        await wait_until(
            lambda: _held(s.database_url, len(OUTAGE_BMCS)),
            timeout=30,
            what="every provision held at its INSERT",
        )
        await asyncio.to_thread(priv.stop)
        t_stop = time.monotonic()
        await tx.commit()
        answers = await asyncio.gather(*sent)
        assert [r.status_code for r in answers] == [202] * len(OUTAGE_BMCS), [r.text for r in answers]
        accepted = [r.json()["job_id"] for r in answers]
        waiting = await _outbox_rows(s.database_url)
        assert waiting == len(accepted), "every accepted command waits in the outbox while NATS is down"
        refused = 0
        for ip in REFUSED_BMCS:  # during the outage: the BMC check needs the bus → 503, nothing kept
            r = await c.post("/controlnode/provision/dell", json={**body, "bmc_IP": ip}, headers=ADMIN)
            assert r.status_code == 503 and r.headers.get("retry-after"), r.text
            refused += 1
        kept = await _scalar(
            s.database_url, "SELECT count(*) FROM gateway.jobs WHERE bmc_ip = ANY(:ips)", ips=REFUSED_BMCS
        )
        assert kept == 0
        await wait_until(lambda: time.monotonic() - t_stop >= 12, timeout=30, what="a 12 s outage")
        assert await _outbox_rows(s.database_url) == len(accepted) and not relayed

        await asyncio.to_thread(priv.start)
        t_back = time.monotonic()

        async def drained() -> bool:
            return await _outbox_rows(s.database_url) == 0

        await wait_until(drained, timeout=60, what="the outbox relayed after NATS returned")
        relayed_after = time.monotonic() - t_back
        for job in accepted:  # each reached a provisioner (not failed by the reconcile)
            got = await wait_job(
                c, job, {"failed", "cancelled", "building", "mounting", "booting"}, timeout=90
            )
            assert got["message"] != NEVER_REACHED, got
            known = await _scalar(
                s.database_url, "SELECT count(*) FROM provision.jobs WHERE id = :id", id=job
            )
            assert known == 1, f"{job} never reached the provisioner"
        assert dict(relayed) == dict.fromkeys(accepted, 1), relayed
        metrics = (await c.get("/metrics")).text
        assert f'karios_outbox_relayed_total{{command="{StartProvision.TYPE}"}} {len(accepted)}.0' in metrics
        retries = re.search(r"^karios_outbox_publish_retries_total (\S+)$", metrics, re.M)
        assert retries and float(retries.group(1)) >= len(accepted), "each waiting command was retried"
    await engine.dispose()
    print(
        f"NATS down {t_back - t_stop:.1f} s: accepted {len(accepted)} (202, waited in the outbox), "
        f"refused {refused} (503), relayed {sum(relayed.values())} once each {relayed_after:.1f} s after "
        f"NATS returned; lost 0, duplicated 0"
    )


async def _held(url: str, n: int) -> bool:
    with contextlib.suppress(Exception):
        return await _lock_waiters(url) >= n
    return False
