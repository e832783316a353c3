"""Drift detection across replicas (real PostgreSQL + NATS): one replica wins each round's
lease, a node's stored state changes only when its verdict does, and the API reads it back."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx

from karios.api_gateway.app import create_app as gateway_app
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.models import NodeDriftRow
from karios.fabric_worker.settings import FabricWorkerSettings
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import sql

NODE = "198.18.77.7"


def _row(kinds: list[str]) -> NodeDriftRow:
    now = datetime.now(UTC)
    findings = [{"kind": k, "message": k} for k in kinds]
    return NodeDriftRow(
        node_ip=NODE, fqdn="n77", drifted=bool(kinds), findings=findings, checked_at=now, since=now
    )


async def test_one_replica_per_round_and_changes_only_on_a_new_verdict(settings, serve) -> None:
    off = FabricWorkerSettings(_env_file=None, drift_interval=0)  # no loop: the test drives the lease
    wa = await serve(worker_app(settings, rollout_settings=off))
    a = wa.app.state.rollout.repo
    b = (await serve(worker_app(settings, rollout_settings=off))).app.state.rollout.repo
    await sql(settings, "UPDATE fabric.drift_round SET started_at = NULL, finished_at = NULL")
    await sql(settings, "DELETE FROM fabric.node_drift WHERE node_ip = :n", n=NODE)

    won = await asyncio.gather(*(r.claim_drift_round(60) for r in (a, b, a, b)))
    assert sorted(won) == [False, False, False, True], won
    winner = a if (await a.drift_round()).owner == a.owner else b
    assert not await winner.claim_drift_round(60)  # not due again before the interval
    await winner.finish_drift_round()
    assert (await a.drift_round()).finished_at is not None
    assert await winner.claim_drift_round(0)  # interval elapsed: due again

    assert await a.store_drift(_row(["frr config"]))  # new and drifted
    first = (await a.drift_rows(NODE))[0]
    assert not await a.store_drift(_row(["frr config"]))  # same verdict: no event
    assert await a.store_drift(_row(["frr config", "vtep0 missing"]))  # new kind: an event
    assert (await a.drift_rows(NODE))[0].since == first.since  # still drifted since the first
    assert await a.store_drift(_row([]))  # repaired
    assert not (await a.drift_rows(NODE))[0].drifted

    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=ADMIN) as c:
        assert await a.store_drift(_row(["bgp session"]))
        r = await c.get(f"/controlnode/fabric-config/drift/{NODE}")
        assert r.status_code == 200, r.text
        assert (r.json()["drifted"], [f["kind"] for f in r.json()["findings"]]) == (True, ["bgp session"])
        view = (await c.get("/controlnode/fabric-config/drift")).json()
        assert NODE in [n["node_ip"] for n in view["nodes"] if n["drifted"]] and view["interval_s"] == 0
        assert (await c.get("/controlnode/fabric-config/drift/10.1.2")).status_code == 422
    await wa.app.state.drift.refresh_metrics()
    async with httpx.AsyncClient(base_url=wa.url, timeout=30) as m:
        text = (await m.get("/metrics")).text
    drifted = [ln for ln in text.splitlines() if ln.startswith("karios_fabric_nodes_drifted ")]
    assert drifted and float(drifted[0].split()[1]) >= 1, drifted
    assert "karios_fabric_drift_last_check_timestamp_seconds " in text
    await a.forget_drift([])
    assert await a.drift_rows(NODE) == []
