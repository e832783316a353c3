"""Drift without false alarms (issue 23, item 8) on real FRR: NATS + PostgreSQL, the inventory,
fabric-worker (drift interval 1 s, settle window SETTLE_S: env ``KARIOS_DRIFT_SETTLE_S``, 20) and
gateway, the lab's 3 namespace nodes and a route reflector.

1. Apply; then a pending config edit (``bfd_enabled``: its ``daemons`` change restarts FRR on
   every node at the next apply): /drift still reports every node, checked against the last
   applied configuration.
2. Apply the edit (every node's FRR restarts, every session and VTEP comes back): the untouched
   fabric then yields no drift event for QUIET_S seconds (env ``KARIOS_DRIFT_QUIET_S``, 60 in CI;
   the issue asks 180).
3. TRIALS times (env ``KARIOS_DRIFT_TRIALS``, default 3): node2's vtep0 deleted → node2 drifts,
   no other node has any drift event; a node apply repairs it.
4. ``neighbor … shutdown`` on node2 → a ``bgp shutdown`` finding on node2 (its first event), no
   other node's event.

Drift events are recorded where the worker publishes them (``drift_watch._publish`` wrapped):
every one, at once, so "no event" is checked without reading a stream to a timeout; the SSE
path of the same events is test_drift_lab.py's. Prints the time from each change to its event
and the settle after each apply (``-s``).
Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.rollout import drift_watch
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import finished, forget_jobs, lab_config, sql
from tests.fixtures.wait import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
QUIET_S = float(os.environ.get("KARIOS_DRIFT_QUIET_S", "60"))
TRIALS = int(os.environ.get("KARIOS_DRIFT_TRIALS", "3"))
SETTLE_S = float(os.environ.get("KARIOS_DRIFT_SETTLE_S", "20"))
CONFIG = lab_config()
CFG = "/controlnode/fabric-config"
DRIFT = f"{CFG}/drift"
BMCS = [f"198.18.8.{i}" for i in (1, 2, 3)]
NODE_IPS = [fabric_lab.underlay_ip(i) for i in (1, 2, 3)]
NODE2 = NODE_IPS[1]
SHUT = "vtysh -c 'configure terminal' -c 'router bgp 65000' -c 'neighbor {peer} shutdown'"


@pytest.fixture(scope="module")
def lab():
    fabric_lab.require_lab()
    with fabric_lab.FabricLab(n_nodes=3, prefix="kd8") as lab:
        yield lab


class Published:
    """Every drift event the worker publishes, in order (as dicts, like the SSE data)."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def of(self, node_ip: str) -> list[dict]:
        return [e for e in self.events if e["node_ip"] == node_ip]

    async def wait(self, node_ip: str, after: int, match, timeout: float = 30) -> dict:
        async def found() -> dict | None:
            return next((e for e in self.of(node_ip)[after:] if match(e)), None)

        return await wait_until(found, timeout=timeout, interval=0.1, what=f"a drift event of {node_ip}")


@pytest.fixture
def published(monkeypatch) -> Published:
    rec = Published()
    publish = drift_watch._publish

    async def record(svc, ev) -> None:
        rec.events.append(ev.model_dump(mode="json"))
        await publish(svc, ev)

    monkeypatch.setattr(drift_watch, "_publish", record)
    return rec


@pytest.fixture
async def api(settings, serve, lab, published):
    await serve(inventory_app(settings))
    rollout = FabricWorkerSettings(
        _env_file=None,
        ssh_key=Path(lab.client_key_path),
        connect_timeout=5,
        verify_timeout=30,
        drift_interval=1.0,
        drift_settle=SETTLE_S,
    )
    await serve(worker_app(settings, rollout_settings=rollout))
    await forget_jobs(settings)
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=NODE_IPS)
    await sql(settings, "DELETE FROM inventory.bmc_infos WHERE os_ip = ANY(:n)", n=NODE_IPS)
    await sql(settings, "DELETE FROM fabric.node_drift")
    await sql(settings, "DELETE FROM fabric.applied_config")
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, timeout=120, headers=ADMIN) as c:
        yield c
        await c.delete(CFG)
    await sql(settings, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = ANY(:b)", b=BMCS)
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=NODE_IPS)


async def _apply(c: httpx.AsyncClient, path: str) -> None:
    r = await c.post(path)
    assert r.status_code == 202, r.text
    job = await finished(c, r.json()["apply_job_id"])
    assert job["job_status"] == "completed", job


async def _view_after(c: httpx.AsyncClient, t: datetime, clean: bool = True) -> dict:
    """The first /drift view from a round after `t` with every node (and, `clean`, none drifted)."""

    async def fresh() -> dict | None:
        view = (await c.get(DRIFT)).json()
        new = all(datetime.fromisoformat(n["checked_at"]) > t for n in view["nodes"])
        ok = view["nodes_total"] == 3 and new and (view["nodes_drifted"] == 0 or not clean)
        return view if ok else None

    return await wait_until(fresh, timeout=60, interval=0.2, what="a fresh drift round over every node")


async def _settled(c: httpx.AsyncClient, t0: float, held: set[str]) -> float:
    """Seconds from `t0` until no node is settling any more; `held` gets what the views held."""

    async def done() -> bool:
        view = (await c.get(DRIFT)).json()
        held.update(f"{n['fqdn']}: {h['kind']}" for n in view["nodes"] for h in n["held"])
        return view["nodes_total"] == 3 and not any(n["settling"] for n in view["nodes"])

    await wait_until(done, timeout=SETTLE_S + 30, interval=0.2, what="every node settled")
    return time.monotonic() - t0


async def _only_node2(pub: Published, cmd: str, kind: str, lab, rounds: float = 4.0) -> float:
    """Run `cmd` on node2: its first drift event names `kind`; `rounds` more seconds pass and no
    other node has a drift event. Returns the seconds to node2's event."""
    before, seen = len(pub.events), len(pub.of(NODE2))
    t0 = time.monotonic()
    res = lab.node_exec("node2", cmd)
    assert res.returncode == 0, res.stderr
    ev = await pub.wait(NODE2, seen, lambda e: e["drifted"])
    took = time.monotonic() - t0
    assert kind in [f["kind"] for f in ev["findings"]], ev
    await asyncio.sleep(rounds)
    others = [e for e in pub.events[before:] if e["node_ip"] != NODE2]
    assert others == [], others
    return took


async def _repair(c: httpx.AsyncClient, pub: Published) -> float:
    seen = len(pub.of(NODE2))
    t0 = time.monotonic()
    await _apply(c, f"{CFG}/node/{NODE2}/apply")
    await pub.wait(NODE2, seen, lambda e: e["state"] == "node_drift_cleared")
    return time.monotonic() - t0


async def test_drift_raises_no_false_alarm_and_names_the_node_that_changed(api, lab, published) -> None:
    c, pub = api, published
    for i, n in enumerate(lab.nodes):
        body = {"bmc_ip": BMCS[i], "os_ip": n.underlay_ip, "os_username": "root", "fqdn": n.name}
        assert (await c.post("/controlnode/register", json=body)).status_code == 200
    assert (await c.post(CFG, json=CONFIG)).status_code in (200, 201)
    timings: dict[str, float | list[float]] = {}
    held: set[str] = set()
    t0 = time.monotonic()
    await _apply(c, f"{CFG}/apply")
    timings["settle after the first apply"] = await _settled(c, t0, held)
    view = await _view_after(c, datetime.now().astimezone())
    assert view["against"] == "config" and view["settle_s"] == SETTLE_S, view

    # (d) A pending edit: every node is still checked, against the last applied configuration.
    assert (await c.post(CFG, json=CONFIG | {"bfd_enabled": True})).status_code in (200, 201)
    assert (await c.get(CFG)).json()["rollout_status"] == "pending"
    view = await _view_after(c, datetime.now().astimezone())
    assert view["against"] == "last_applied", view
    assert all(n["frr_config_sha256"] == n["intent_sha256"] != "" for n in view["nodes"]), view

    # (a) Apply the edit (FRR restarts on every node): no drift event for QUIET_S seconds.
    t0 = time.monotonic()
    await _apply(c, f"{CFG}/apply")
    applied = time.monotonic()
    timings["settle after a changing apply"] = await _settled(c, t0, held)
    await asyncio.sleep(max(0.0, QUIET_S - (time.monotonic() - applied)))
    assert pub.events == [], pub.events  # none since the first apply either
    view = await _view_after(c, datetime.now().astimezone())
    assert view["against"] == "config", view

    # (b) vtep0 deleted on node2: exactly node2 drifts, every trial.
    timings["vtep0 missing"], timings["repaired"] = [], []
    for _ in range(TRIALS):
        timings["vtep0 missing"].append(await _only_node2(pub, "ip link del vtep0", "vtep0 missing", lab))
        timings["repaired"].append(await _repair(c, pub))

    # (c) neighbor shutdown by hand: named as such, on node2 only, in its first event.
    seen = len(pub.of(NODE2))
    shut = SHUT.format(peer=fabric_lab.FABRIC_IP)
    timings["bgp shutdown"] = await _only_node2(pub, shut, "bgp shutdown", lab)
    assert [f["kind"] for f in pub.of(NODE2)[seen]["findings"]] == ["bgp shutdown"], pub.of(NODE2)
    node = (await c.get(f"{DRIFT}/{NODE2}")).json()
    (finding,) = [f for f in node["findings"] if f["kind"] == "bgp shutdown"]
    assert finding["message"] == f"BGP neighbor {fabric_lab.FABRIC_IP} administratively shut down"
    timings["repaired"].append(await _repair(c, pub))
    view = await _view_after(c, datetime.now().astimezone())
    assert view["nodes_drifted"] == 0, view
    assert {e["node_ip"] for e in pub.events} == {NODE2}, pub.events
    print(f"\ndrift alarms: quiet {QUIET_S:.0f} s, settle window {SETTLE_S:.0f} s; seconds:", timings)
    print("held (not reported) after the applies:", sorted(held))
