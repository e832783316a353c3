"""examples/subscriber against a live system, as another system would run it.

A private nats-server (JetStream) with two users: ``karios`` for the services and ``integrator``
with exactly the permissions of examples/subscriber/nats-permissions.conf (the block
docs/integrations.md shows). The real inventory, provisioner (Redfish emulator), fabric-worker and
gateway run in this process on it. The subscriber runs as a subprocess and must receive:

- the provision's events (queued … booting, then cancelled) of a job on the Redfish emulator;
- a node registration and a fabric apply's events (the SSH target refuses: the apply fails);
- one line per event although a copy of an event is stored twice (same envelope ``id``);
- every event on a subject and with a payload the AsyncAPI document declares;
- from a replay by start sequence and by start time exactly the events from that point on,
  and nothing again when restarted with its file of handled ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import nats
import pytest
from nats.js.api import ConsumerConfig

from karios.api_gateway.app import create_app as gateway_app
from karios.common.bus.envelope import Envelope
from karios.common.bus.streams import ensure_streams
from karios.common.bus.subjects import Subjects
from karios.common.contracts.asyncapi import build_document
from karios.common.contracts.base import CONTRACTS
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN, REQUIRE, free_port
from tests.fixtures.fabric import finished, forget_jobs, sql
from tests.fixtures.provision import retire_leftover_jobs, use_installer_media, wait_job, write_inventory
from tests.fixtures.wait import wait_until, wait_until_sync
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "subscriber"
BMC, NODE_BMC, NODE_IP = "10.99.7.1", "198.18.77.1", "127.0.0.83"  # nothing listens on NODE_IP:22
FABRIC = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_nos": "other",
    "fabric_switch_peering_ip": "198.18.0.254",
    "fabric_switch_role": "spine",
    "management_cidr": "127.0.0.0/24",
    "router_id_cidr": "198.19.8.1/24",
    "vxlan_mtu": 1500,
    "ospf_enabled": False,
}


@pytest.fixture(scope="module")
def nats_server():
    """``nats-server`` with the services' user and the integrator's restricted one → (port, dir)."""
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not Path(binary).exists():
        if REQUIRE:
            pytest.fail("nats-server required in CI", pytrace=False)
        pytest.skip("nats-server not installed")
    work = Path(tempfile.mkdtemp(prefix="karios-integrator-nats-"))
    shutil.copyfile(EXAMPLE / "nats-permissions.conf", work / "nats-permissions.conf")
    port = free_port()
    (work / "server.conf").write_text(
        f"listen: 127.0.0.1:{port}\n"
        f'jetstream {{ store_dir: "{work / "js"}" }}\n'
        "include ./nats-permissions.conf\n"
        "accounts { KARIOS { jetstream: enabled, users: [\n"
        "  { user: karios, password: karios-pw }\n"
        "  { user: integrator, password: integrator-pw, permissions: $KARIOS_INTEGRATOR }\n"
        "] } }\n"
    )
    log = (work / "nats.log").open("wb")
    proc = subprocess.Popen([binary, "-c", str(work / "server.conf")], stdout=log, stderr=log)
    try:
        wait_until_sync(lambda: _port_open(port) or proc.poll() is not None, timeout=20, what="nats-server")
        assert proc.poll() is None, (work / "nats.log").read_text()[-2000:]
        yield port, work
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def emulator():
    try:
        emu = RedfishEmulator([fake_system("sub1")], auth=True)
        emu.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        if REQUIRE:
            pytest.fail(f"sushy-tools emulator required in CI: {exc}", pytrace=False)
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


@pytest.fixture
async def system(settings, serve, emulator, nats_server, tmp_path):
    """The four services on the private server, bus prefix ``karios`` → the gateway's URL."""
    port, _ = nats_server
    own = settings.model_copy(
        update={"nats_url": f"nats://karios:karios-pw@127.0.0.1:{port}", "bus_prefix": "karios"}
    )
    await retire_leftover_jobs(own.database_url)
    inventory = write_inventory(tmp_path / "inventory.yaml", [BMC])
    await serve(inventory_app(own.model_copy(update={"inventory_file": inventory})))
    cfg = ProvisionerConfig(
        cache_dir=Path(tempfile.gettempdir()) / "karios-test-media-cache",
        media_dir=tmp_path / "media",
        images_dir=tmp_path / "images",
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=15,
        power_deadline=20,
        install_method="preseed",
        bmc_endpoints={
            BMC: {
                "url": emulator.url,
                "system_id": emulator.system_ids[0],
                "username": emulator.username,
                "password": emulator.password,
            }
        },
    )
    prov_app = provisioner_app(own, cfg)
    use_installer_media(prov_app.state.jobs)
    prov = await serve(prov_app)
    key = tmp_path / "id_ed25519"
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    rollout = FabricWorkerSettings(ssh_key=key, vnis="100", connect_timeout=4, heartbeat_interval=0.5)
    await serve(worker_app(own, rollout_settings=rollout))
    await forget_jobs(own)
    gw = await serve(gateway_app(own))
    cfg.media_url, cfg.callback_url = prov.url, gw.url
    yield gw.url, port
    await sql(own, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = :b", b=NODE_BMC)


class Subscriber:
    """``examples/subscriber/subscriber.py --json`` as a subprocess; its events and its stderr."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc, self.events, self.log = proc, [], []
        self._tasks = [
            asyncio.create_task(self._read(proc.stdout, True)),
            asyncio.create_task(self._read(proc.stderr, False)),
        ]

    @classmethod
    async def start(cls, port: int, *args: str) -> Subscriber:
        url = f"nats://integrator:integrator-pw@127.0.0.1:{port}"
        cmd = [sys.executable, str(EXAMPLE / "subscriber.py"), "--nats-url", url, "--json", *args]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return cls(proc)

    async def _read(self, stream: Any, events: bool) -> None:
        async for line in stream:
            (self.events if events else self.log).append(json.loads(line) if events else line.decode())

    def of(self, pred) -> list[dict]:  # type: ignore[no-untyped-def]
        return [e for e in self.events if pred(e)]

    async def wait_for(self, pred, what: str, timeout: float = 90) -> dict:  # type: ignore[no-untyped-def]
        return await wait_until(lambda: next(iter(self.of(pred)), None), timeout=timeout, what=what)  # type: ignore[no-any-return]

    async def ended(self, timeout: float = 60) -> int:
        """Its exit status once it ended (``--exit-when-idle``, or after :meth:`stop`)."""
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        await asyncio.gather(*self._tasks)
        return code

    async def stop(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        return await self.ended()


def _declared(doc: dict[str, Any], subject: str, type_name: str) -> bool:
    """Is ``subject`` a channel address of the document that carries the message ``type_name``?"""
    for channel in doc["channels"].values():
        pattern = re.sub(r"\\\{\w+\\\}", "[^.]+", re.escape(channel["address"]))
        names = {
            doc["components"]["messages"][r["$ref"].rsplit("/", 1)[1]]["name"]
            for r in channel["messages"].values()
        }
        if re.fullmatch(pattern, subject) and type_name in names:
            return True
    return False


async def test_example_subscriber_receives_provision_and_fabric_events_once_and_replays(
    system, tmp_path
) -> None:
    gw, port = system
    seen_file = tmp_path / "seen.txt"
    live = await Subscriber.start(port, "--seen-file", str(seen_file))
    try:
        await wait_until(
            lambda: any("subscribed:" in x for x in live.log) or live.proc.returncode is not None,
            timeout=30,
            what="the subscriber to subscribe",
        )
        assert live.proc.returncode is None, "".join(live.log)
        async with httpx.AsyncClient(base_url=gw, timeout=30, headers=ADMIN) as c:
            # A provision on the Redfish emulator, cancelled once it boots.
            r = await c.post(
                "/controlnode/provision/dell",
                json={
                    "bmc_IP": BMC,
                    "vendor": "dell",
                    "hostname": "sub1",
                    "os_password": "os-s3cret-pw",
                    "selected_disks": ["sda"],
                    "pool_type": "single",
                },
            )
            assert r.status_code == 202, r.text
            job = r.json()["job_id"]
            booting = await live.wait_for(
                lambda e: e["data"].get("job_id") == job and e["data"]["state"] == "booting",
                "the provision's booting event",
            )
            assert (await c.post(f"/controlnode/job/{job}/cancel")).status_code in (200, 202)
            await wait_job(c, job, {"cancelled"})
            await live.wait_for(
                lambda e: e["data"].get("job_id") == job and e["data"]["state"] == "cancelled",
                "the provision's cancelled event",
            )

            # A node and a fabric apply (its SSH target refuses: the job fails, with events).
            r = await c.post(
                "/controlnode/register", json={"bmc_ip": NODE_BMC, "os_ip": NODE_IP, "fqdn": "sub-node"}
            )
            assert r.status_code == 200, r.text
            assert (await c.post("/controlnode/fabric-config", json=FABRIC)).status_code in (200, 201)
            try:
                r = await c.post("/controlnode/fabric-config/apply")
                assert r.status_code == 202, r.text
                apply_job = r.json()["apply_job_id"]
                done = await finished(c, apply_job, timeout=60)
                final = f"apply_{done['job_status']}"
                await live.wait_for(
                    lambda e: e["data"].get("job_id") == apply_job and e["data"]["state"] == final,
                    f"the fabric {final} event",
                )
            finally:
                await c.delete("/controlnode/fabric-config")

        # The same envelope stored twice (a re-publish after the duplicate window): handled once.
        first = live.events[0]
        body = {k: v for k, v in first.items() if k not in ("seq", "nats_subject", "stream_time")}
        nc = await nats.connect(f"nats://karios:karios-pw@127.0.0.1:{port}")
        try:
            ack = await nc.jetstream().publish(first["nats_subject"], json.dumps(body).encode())
            assert ack.seq > first["seq"] and not ack.duplicate
        finally:
            await nc.close()
        await wait_until(
            lambda: any(f"duplicate id={first['id']}" in x for x in live.log),
            timeout=30,
            what="the duplicate to be skipped",
        )
    finally:
        assert await live.stop() == 0, "".join(live.log)

    ids = [e["id"] for e in live.events]
    assert len(ids) == len(set(ids)), "an event was printed twice"
    assert seen_file.read_text().split() == ids
    doc = build_document()
    for e in live.events:
        assert _declared(doc, e["nats_subject"], e["type"]), (
            f"{e['nats_subject']} / {e['type']} not in docs/asyncapi.json"
        )
        Envelope[CONTRACTS[e["type"]]].model_validate(e)  # the payload is the published schema's
    types = {e["type"] for e in live.events}
    assert {
        "karios.provision.job_progress.v1",
        "karios.fabric.rollout_event.v1",
        "karios.inventory.node_registered.v1",
    } <= types
    states = [e["data"]["state"] for e in live.events if e["data"].get("job_id") == job]
    assert states[0] == "queued" and "booting" in states and states[-1] == "cancelled", states
    assert booting["seq"] < next(
        e["seq"] for e in live.events if e["type"] == "karios.fabric.rollout_event.v1"
    )

    # Replay from a stream sequence, then from a time: every event from that point on, in order
    # (the stream may have grown since: DELETE /fabric-config tears the node down, with events).
    nc = await nats.connect(f"nats://karios:karios-pw@127.0.0.1:{port}")
    try:
        last = (await nc.jetstream().stream_info("KARIOS_EVT")).state.last_seq
    finally:
        await nc.close()
    start = next(e for e in live.events if e["type"] == "karios.inventory.node_registered.v1")
    # The client rounds the stream's nanosecond time to microseconds (up, at times): start 1 ms early.
    since = datetime.fromisoformat(start["stream_time"]) - timedelta(milliseconds=1)
    before = [e for e in live.events if e["seq"] < start["seq"]]
    assert datetime.fromisoformat(before[-1]["stream_time"]) < since
    for how in (["--start-seq", str(start["seq"])], ["--start-time", since.isoformat()]):
        replay = await Subscriber.start(port, "--replay", *how, "--exit-when-idle", "3")
        assert await replay.ended() == 0, "".join(replay.log)
        got = [e["seq"] for e in replay.events]
        assert got[: got.index(last) + 1] == list(range(start["seq"], last + 1)), (how, got)
        assert {e["id"] for e in live.events if e["seq"] >= start["seq"]} <= {e["id"] for e in replay.events}

    # Restarted with its file of handled ids, from the beginning: nothing is handled twice.
    again = await Subscriber.start(
        port, "--replay", "--start-seq", "1", "--seen-file", str(seen_file), "--exit-when-idle", "3"
    )
    assert await again.ended() == 0, "".join(again.log)
    assert not {e["id"] for e in again.events} & set(ids)
    assert f"skipped {len(ids) + 1} duplicate(s)" in "".join(again.log)


async def test_the_integrator_permissions_allow_nothing_else(nats_server) -> None:
    """The documented block lets the integrator read its own durable, and not publish events or
    take over another consumer (e.g. the gateway's read model)."""
    port, _ = nats_server
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(
        f"nats://integrator:integrator-pw@127.0.0.1:{port}",
        inbox_prefix="_INBOX_integrator",
        error_cb=on_error,
    )
    karios = await nats.connect(f"nats://karios:karios-pw@127.0.0.1:{port}")
    try:
        await ensure_streams(karios.jetstream(), Subjects())  # as the services create them
        js = nc.jetstream(timeout=2)
        with pytest.raises(Exception):  # noqa: B017 - a permissions violation times the request out
            await js.add_consumer(
                "KARIOS_EVT",
                ConsumerConfig(
                    name="gateway-provision-projector", durable_name="gateway-provision-projector"
                ),
            )
        await nc.publish("karios.evt.provision.job.completed.x", b"{}")
        await nc.flush()
        await wait_until(lambda: len(errors) >= 2, timeout=10, what="the permission violations")
        assert all("permissions violation" in str(e).lower() for e in errors), errors
    finally:
        await nc.close()
        await karios.close()
