"""Every API route against its latency limit (issue 28, item 1): not only the benchmarked ones.

    uv run python benchmarks/every_route.py [--requests 300] [--clients 4] [--connections 100]
        [--seconds 3] [--nodes 1000] [--jobs 2000]
        [--only 'GET /controlnode/jobs,POST /controlnode/register'] [--keep]

Runs ``karios up`` (embedded NATS; a fresh database on the PostgreSQL of ``KARIOS_BENCH_PG``,
default 127.0.0.1:5432, dropped at the end) with a file inventory of one device per BMC the run
needs, and a sushy-tools Redfish emulator (tests/lab/redfish_lab.py, its cached venv) standing in
for two BMCs. Seeds through the real API: ``--nodes`` registered nodes, the fabric's (POST
/controlnode/register, OS addresses on 127.3.0.0/16, where nothing listens on the SSH port: every
SSH attempt is refused at once); ``--jobs`` provisioning jobs in batches of 50 (POST
/controlnode/provision on BMCs at 127.1.0.0/16, where no BMC answers: each job fails at its BMC
check); the fabric configuration, one forced fabric apply and one preflight; API tokens; two BMC
inspections; 200 unknown machines' hardware reports (each with the discovery token bootapi put on
its boot's kernel line; a quarter adopted). Every write is an audit record, every job a few events.

Then, for EVERY operation of docs/openapi/gateway.json (paths x methods, enumerated from the
file), ``--requests`` timed requests (after a few untimed warm-ups) from ``--clients`` concurrent
clients, path parameters filled with ids from the seeded data (rotating, so caches are not only
hit): p50 / p99 against the route's limit (:data:`LIMITS`). A route that changes state is
exercised with a valid request whose effect is cheap (idempotent where it can be: the same
registration again, the same config again, a cancelled job cancelled again; else a fresh seeded
id each time: a token revoked, a node removed, a BMC provisioned); where no cheap valid request
exists, with a 4xx that takes the route's real path (the "request" column says which). Every
operation must have a request here (:data:`OPS`): one without is listed as not exercised and
fails the run, as does any unexpected status (a 5xx above all). Exit status 1 if any row fails.

The issue's limits hold "at 100 connections": every route without an own limit is measured by
``wrk`` holding ``--connections`` connections for ``--seconds`` (a Lua script sends the requests
the route's maker prepared, cycling through them, or once each where a request uses up what it
names), after the warm-ups. wrk costs a few µs of CPU per request; httpx, a few hundred, which at
100 connections on 2 cores would measure the client. Routes with an own limit (they talk to BMCs
or SSH to nodes, a few at a time by design) and the SSE stream keep the httpx clients. The
``load`` column says which; without wrk every row is httpx's.

The core (:func:`seed`, :func:`measure_all`) takes an HTTP client on the gateway (admin token):
``tests/integration/test_every_route.py`` runs it with a few requests per route on the in-process
services (timings are never asserted there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: benchmarks.launch, tests.lab

from benchmarks.launch import KariosUp, ensure_debian_tools  # noqa: E402

OPENAPI = ROOT / "docs" / "openapi" / "gateway.json"
METHODS = ("get", "put", "post", "patch", "delete")

#: p99 limits in milliseconds (issue 28, item 1: "every authenticated route p99 < 50 ms at 100
#: connections (reads) and < 100 ms (writes that answer 202)"). Every read (GET, and the POSTs that
#: only read: provision progress, fabric plan) 50 ms; every write 100 ms. A route that is
#: inherently slower has its own limit here, keyed "METHOD path", with the reason.
LIMITS: dict[str, tuple[float, str]] = {
    "read": (50.0, "every read"),
    "write": (100.0, "every write"),
    "POST /controlnode/bmc/{bmc_ip}/inspect": (
        3000.0,
        "reads the hardware from the BMC: a few dozen Redfish GETs, a few at a time (here: sushy-tools)",
    ),
    "POST /controlnode/fabric-config/preflight": (
        5000.0,
        "SSH fan-out to every fabric node (here: 1,000 nodes that refuse at once)",
    ),
    "POST /controlnode/fabric-config/diff": (
        1000.0,
        "SSH to the node: discover, render, diff (here: the node refuses at once)",
    ),
    "GET /controlnode/fabric-config/node/{node_ip}/postdeploy": (
        1000.0,
        "a live check of the node over SSH (here: the node refuses at once)",
    ),
    "DELETE /controlnode/fabric-config/node/{node_ip}": (
        1000.0,
        "SSH to the node to remove the fabric (here: the node refuses at once)",
    ),
}
WARMUP = 3  # untimed requests per route before the timed ones
HANGING = 8  # jobs cancelled at the provisioner while they wait for a BMC (POST …/cancel again)
DISCOVERED = 200  # unknown machines that report their hardware (discovery mode); a quarter adopted
DISCOVERY_HEADER = "X-Karios-Discovery-Token"
BATCH = 50  # seeded provisioning jobs per batch (parent_id), as a UI batch


def limit_of(op_key: str, kind: str) -> tuple[float, str]:
    return LIMITS.get(op_key) or LIMITS[kind]


def ip(net: int, k: int) -> str:
    """The k-th address of 127.<net>.0.0/16 (last octet 1..250)."""
    return f"127.{net}.{k // 250}.{k % 250 + 1}"


# -- what the run knows: the system's BMCs and the seeded ids ---------------------------------------


@dataclass
class World:
    """What the starter set up (the inventory) and what :func:`seed` created."""

    job_bmcs: list[str]  # inventory devices, no BMC answers: seeded jobs, then fresh provisions
    emulated: list[str]  # inventory devices answered by the Redfish emulator ([] without one)
    hanging: list[str]  # inventory devices whose BMC accepts the connection and never answers
    #: A discovery token for a MAC, as the boot of an unknown machine gets it (bootapi's script)
    discovery_token: Callable[[str], Awaitable[str]] | None = None
    jobs: int = 0  # seeded jobs
    nodes: int = 0  # seeded registered nodes
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    node_ips: list[str] = field(default_factory=list)
    registrations: list[dict[str, Any]] = field(default_factory=list)
    victims: list[str] = field(default_factory=list)  # nodes DELETE /nodes/{ip} removes, one each
    job_ids: list[str] = field(default_factory=list)
    job_names: dict[str, str] = field(default_factory=dict)
    job_bmc_of: dict[str, str] = field(default_factory=dict)
    batches: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    revoke: list[str] = field(default_factory=list)
    rotate: list[str] = field(default_factory=list)
    fabric_job: str = ""
    discovered: list[str] = field(default_factory=list)  # ids
    adopted: dict[str, str] = field(default_factory=dict)  # id -> hostname
    reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (token, report)
    fabric_config: dict[str, Any] = field(default_factory=dict)
    fresh: int = 0  # next unused index of job_bmcs for a provision

    def next_fresh(self) -> str:
        if self.fresh >= len(self.job_bmcs):
            raise RuntimeError("out of fresh BMCs: the inventory is too small for --requests")
        self.fresh += 1
        return self.job_bmcs[self.fresh - 1]


def pick(seq: list[str], i: int) -> str:
    return seq[(i * 7919) % len(seq)]  # a stride through the ids: not the same hot row each time


@dataclass
class Req:
    params: dict[str, str] = field(default_factory=dict)  # path parameters
    query: dict[str, Any] | None = None
    body: Any = None
    headers: dict[str, str] | None = None


@dataclass
class Op:
    kind: str  # "read" | "write"
    request: str  # what the request is: "valid …" or "4xx …: why no cheap valid one"
    make: Callable[[World, int], Req]
    expect: tuple[int, ...] = (200,)
    n: int | None = None  # its own request count (slow routes), else --requests
    clients: int | None = None  # its own concurrency, else --clients
    setup: Callable[[httpx.AsyncClient, World, int], Awaitable[None]] | None = None  # untimed, per request
    settle: bool = False  # wait for the provisioner's queue to empty afterwards
    sse: bool = False  # time to the response headers, then close
    last: bool = False  # measured after every other route (it removes what they need)
    needs_bmc: bool = False  # skipped (listed) when no BMC emulator runs
    needs_discovery: bool = False  # skipped (listed) when the starter gives no discovery tokens
    #: Each request uses up what it names (a victim node, a token revoked, a fresh BMC): under
    #: ``--connections`` the prepared requests are sent once each, never cycled.
    once: bool = False


FABRIC = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_name": "leaf-01",
    "fabric_switch_nos": "eos",
    "fabric_switch_peering_ip": "10.255.0.254",
    "fabric_switch_role": "leaf",
    "management_cidr": "192.168.111.0/24",
    "router_id_cidr": "10.255.0.1/20",
    "vxlan_mtu": 9216,
    "public_mtu": 1500,  # a fabric of this size plans as a DC deployment, which needs it
    "expected_nodes": 1000,  # the planner's upper bound (a sizing hint, not a limit on nodes)
    "expected_vms": 10000,
    "ospf_enabled": True,
    "ospf_area": "0.0.0.0",
    "bfd_enabled": True,
}
NO_TOKEN = {"X-Karios-Job-Token": "not-the-job-token"}


def provision_body(w: World, vendor: str, k: int | None = None) -> dict[str, Any]:
    bmc = w.next_fresh() if k is None else w.job_bmcs[k]
    n = w.job_bmcs.index(bmc) if k is None else k
    return {
        "bmc_IP": bmc,
        "vendor": vendor,
        "hostname": f"bench-{n}",
        "selected_disks": ["sda"],
        "os_password": "bench-os-pw",
        "ssh_authorized_keys": [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchBenchBenchBenchBenchBenchBenchBench bench"
        ],
    }


def discovery_report(k: int) -> dict[str, Any]:
    """What discover.sh reports for the k-th unknown machine (DMI, CPU, memory, disks, NICs, PCI)."""
    mac, mac2 = (f"52:54:09:{k >> 8 & 255:02x}:{k & 255:02x}:{n:02x}" for n in (1, 2))
    return {
        "agent": "karios-discovery/1",
        "boot_mac": mac,
        "ip": ip(8, k),
        "kernel": "6.1.0-28-amd64",
        "dmi": {
            "sys_vendor": "Dell Inc.",
            "product_name": "PowerEdge R750",
            "product_serial": f"BENCH{k:05d}",
            "bios_vendor": "Dell Inc.",
            "bios_version": "1.10.2",
        },
        "cpu_model": "Intel(R) Xeon(R) Gold 6354 CPU @ 3.00GHz",
        "cpu_threads": 72,
        "memory_mib": 262144,
        "disks": [
            {"name": f"sd{d}", "size_bytes": 480_103_981_056, "model": "MZ7L3480", "serial": f"S{k:05d}{d}"}
            for d in "ab"
        ],
        "nics": [
            {"name": "eno1", "mac": mac, "link": "up", "speed_mbps": 25000, "driver": "bnxt_en"},
            {"name": "eno2", "mac": mac2, "link": "down", "driver": "bnxt_en"},
        ],
        "pci": [
            {"address": "0000:17:00.0", "vendor_id": "10de", "device_id": "2236", "class_code": "030200"},
            {"address": "0000:31:00.0", "vendor_id": "14e4", "device_id": "16d7", "class_code": "020000"},
        ],
    }


async def _recreate_fabric(c: httpx.AsyncClient, w: World, _i: int) -> None:
    """The config back, once the teardown the last DELETE queued (nodes hold VTEPs) has ended."""
    deadline = time.monotonic() + 600
    while True:
        r = await c.post("/controlnode/fabric-config", json=w.fabric_config)
        if r.status_code in (200, 201):
            return
        if r.status_code != 409 or "FABRIC_JOB_RUNNING" not in r.text or time.monotonic() > deadline:
            raise RuntimeError(f"re-creating the fabric config: {r.status_code} {r.text[:300]}")
        await asyncio.sleep(0.5)


def _vendor_op(vendor: str) -> Op:
    return Op(
        "write",
        f"valid: provision a fresh inventory BMC ({vendor}); the job fails at its BMC check",
        lambda w, i: Req(body=provision_body(w, vendor)),
        expect=(202,),
        settle=True,
        once=True,
    )


#: One request maker per operation of the OpenAPI document, keyed "METHOD path".
OPS: dict[str, Op] = {
    "GET /controlnode/audit": Op("read", "valid: newest 100 records", lambda w, i: Req()),
    "GET /controlnode/bmc-tls": Op("read", "valid", lambda w, i: Req()),
    "DELETE /controlnode/bmc-tls/{bmc_ip}": Op(
        "write",
        "404: no pin for a BMC never contacted (clearing a real pin needs a new contact each time)",
        lambda w, i: Req({"bmc_ip": pick(w.job_bmcs[w.jobs :], i)}),
        expect=(404,),
    ),
    "GET /controlnode/bmc/{bmc_ip}/disks": Op(
        "read", "valid", lambda w, i: Req({"bmc_ip": pick(w.job_bmcs, i)})
    ),
    "GET /controlnode/bmc/{bmc_ip}/gpus": Op(
        "read", "valid", lambda w, i: Req({"bmc_ip": pick(w.job_bmcs, i)})
    ),
    "GET /controlnode/bmc/{bmc_ip}/hardware": Op(
        "read",
        "valid: an inspected BMC's record",
        lambda w, i: Req({"bmc_ip": w.emulated[i % len(w.emulated)]}),
        needs_bmc=True,
    ),
    "GET /controlnode/bmc/{bmc_ip}/hardware/diff": Op(
        "read",
        "valid: an inspected BMC's record against its inventory device",
        lambda w, i: Req({"bmc_ip": w.emulated[i % len(w.emulated)]}),
        needs_bmc=True,
    ),
    "POST /controlnode/bmc/{bmc_ip}/inspect": Op(
        "write",
        "valid: inspect an emulated BMC (the record is replaced)",
        lambda w, i: Req({"bmc_ip": w.emulated[i % len(w.emulated)]}, body={"vendor": "generic"}),
        n=40,
        clients=2,
        needs_bmc=True,
    ),
    "POST /controlnode/bmc/{bmc_ip}/rotate-credentials": Op(
        "write",
        "409 BMC_ROTATION_REFUSED: credentials set in BMC_ENDPOINTS (the emulator has no AccountService)",
        lambda w, i: Req({"bmc_ip": w.emulated[i % len(w.emulated)]}),
        expect=(409,),
        needs_bmc=True,
    ),
    "POST /controlnode/bmc/{bmc_ip}/firmware-update": Op(
        "write",
        "422 naming sha256 (not hex): a valid update would flash the emulated BMCs' BIOS each round",
        lambda w, i: Req(
            {"bmc_ip": w.emulated[i % len(w.emulated)]},
            body={"image": "fw/bios.bin", "sha256": "z" * 64},
        ),
        expect=(422,),
        needs_bmc=True,
    ),
    "GET /controlnode/bmc/{bmc_ip}/firmware-updates/{update_id}": Op(
        "read",
        "404 FIRMWARE_UPDATE_NOT_FOUND: an id no update has (the query goes to the provisioner)",
        lambda w, i: Req({"bmc_ip": w.emulated[i % len(w.emulated)], "update_id": f"none-{i}"}),
        expect=(404,),
        needs_bmc=True,
    ),
    "POST /controlnode/images": Op(
        "write",
        "422 naming sha256 (not hex): a valid registration downloads and converts an image each round",
        lambda w, i: Req(
            body={
                "name": f"img-{i}",
                "source_url": "http://127.0.0.1:9/x.qcow2",
                "format": "qcow2",
                "sha256": "z" * 64,
            }
        ),
        expect=(422,),
    ),
    "GET /controlnode/images": Op("read", "valid: the catalog (empty in this world)", lambda w, i: Req()),
    "GET /controlnode/images/{name}": Op(
        "read",
        "404 IMAGE_NOT_FOUND: no image is registered in this world (the query goes to the provisioner)",
        lambda w, i: Req({"name": f"none-{i}"}),
        expect=(404,),
    ),
    "DELETE /controlnode/images/{name}": Op(
        "write",
        "404 IMAGE_NOT_FOUND: no image is registered in this world",
        lambda w, i: Req({"name": f"none-{i}"}),
        expect=(404,),
    ),
    "GET /controlnode/discovered": Op(
        "read", f"valid: the first page (100 of {DISCOVERED})", lambda w, i: Req(), needs_discovery=True
    ),
    "GET /controlnode/discovered/{id}": Op(
        "read", "valid", lambda w, i: Req({"id": pick(w.discovered, i)}), needs_discovery=True
    ),
    "POST /controlnode/discovered/{id}/adopt": Op(
        "write",
        "valid: adopt an adopted server again, same hostname (answers the same)",
        lambda w, i: (lambda d: Req({"id": d}, body={"hostname": w.adopted[d]}))(pick(list(w.adopted), i)),
        needs_discovery=True,
    ),
    "POST /controlnode/discovery/report": Op(
        "write",
        "valid: a discovered machine reports again, its boot's token (same record)",
        lambda w, i: (lambda t, b: Req(body=b, headers={DISCOVERY_HEADER: t}))(
            *w.reports[(i * 7919) % len(w.reports)]
        ),
        needs_discovery=True,
    ),
    "GET /controlnode/events": Op(
        "read",
        "valid: SSE, channel provision; time to the response headers",
        lambda w, i: Req(query={"channel": "provision"}),
        sse=True,
    ),
    "DELETE /controlnode/fabric-config": Op(
        "write",
        "valid: delete the config, its nodes' teardown queued (re-created before each, untimed; 1 client)",
        lambda w, i: Req(),
        setup=_recreate_fabric,
        n=10,
        clients=1,
        last=True,
    ),
    "GET /controlnode/fabric-config": Op("read", "valid", lambda w, i: Req()),
    "POST /controlnode/fabric-config": Op(
        "write", "valid: the same config again (upsert, 200)", lambda w, i: Req(body=w.fabric_config)
    ),
    "POST /controlnode/fabric-config/apply": Op(
        "write",
        "409 FABRIC_PREFLIGHT_BLOCKED: the last preflight found the nodes unreachable (the full check)",
        lambda w, i: Req(),
        expect=(409,),
    ),
    "POST /controlnode/fabric-config/apply/{job_id}/cancel": Op(
        "write",
        "404: the seeded apply has ended (no apply in flight to cancel)",
        lambda w, i: Req({"job_id": w.fabric_job}),
        expect=(404,),
    ),
    "GET /controlnode/fabric-config/batches/{batch_id}/postdeploy": Op(
        "read",
        f"valid: a seeded batch of {BATCH} jobs",
        lambda w, i: Req({"batch_id": pick(w.batches, i)}),
    ),
    "POST /controlnode/fabric-config/diff": Op(
        "read",
        "valid: one node (?node_ip)",
        lambda w, i: Req(query={"node_ip": pick(w.node_ips, i)}),
        n=100,
    ),
    "GET /controlnode/fabric-config/drift": Op("read", "valid", lambda w, i: Req()),
    "GET /controlnode/fabric-config/drift/{node_ip}": Op(
        "read",
        "valid (404: no drift round has checked the node yet)",
        lambda w, i: Req({"node_ip": pick(w.node_ips, i)}),
        expect=(200, 404),
    ),
    "GET /controlnode/fabric-config/latest": Op("read", "valid: the seeded apply", lambda w, i: Req()),
    "DELETE /controlnode/fabric-config/node/{node_ip}": Op(
        "write",
        "valid: tear down a node (unreachable: removed=false)",
        lambda w, i: Req({"node_ip": pick(w.node_ips, i)}),
        n=100,
    ),
    "POST /controlnode/fabric-config/node/{node_ip}/apply": Op(
        "write",
        "409 FABRIC_PREFLIGHT_BLOCKED: the node was unreachable at the last preflight",
        lambda w, i: Req({"node_ip": pick(w.node_ips, i)}),
        expect=(409,),
    ),
    "GET /controlnode/fabric-config/node/{node_ip}/postdeploy": Op(
        "read",
        "valid: a node's checklist",
        lambda w, i: Req({"node_ip": pick(w.node_ips, i)}),
        n=100,
    ),
    "POST /controlnode/fabric-config/plan": Op(
        "read", "valid: dry run of the stored config's fields", lambda w, i: Req(body=FABRIC)
    ),
    "POST /controlnode/fabric-config/preflight": Op(
        "write",
        "valid: every node (results stored on the config)",
        lambda w, i: Req(body={"underlay_cidr": "127.3.0.0/16"}),
        n=10,
        clients=1,
    ),
    "GET /controlnode/fabric-config/vtep-pool": Op("read", "valid", lambda w, i: Req()),
    "POST /controlnode/firstboot": Op(
        "write",
        "401: no job token (only the installed system has it; same answer as a wrong one)",
        lambda w, i: Req(
            body={"bmc_ip": w.job_bmc_of[pick(w.job_ids, i)], "os_ip": ip(5, i % 60000)}, headers=NO_TOKEN
        ),
        expect=(401,),
    ),
    "GET /controlnode/job/{id}": Op("read", "valid", lambda w, i: Req({"id": pick(w.job_ids, i)})),
    "PATCH /controlnode/job/{id}": Op(
        "write",
        "valid: resource_name set to the one it has",
        lambda w, i: (lambda j: Req({"id": j}, body={"resource_name": w.job_names[j]}))(pick(w.job_ids, i)),
    ),
    "POST /controlnode/job/{id}/cancel": Op(
        "write",
        "valid: cancel a cancelled job again (idempotent)",
        lambda w, i: Req({"id": w.cancelled[i % len(w.cancelled)]}),
    ),
    "POST /controlnode/job/{id}/complete": Op(
        "write",
        "401: no job token (only the boot medium has it)",
        lambda w, i: Req({"id": pick(w.job_ids, i)}, body={"os_ip": "192.0.2.10"}, headers=NO_TOKEN),
        expect=(401,),
    ),
    "POST /controlnode/job/{id}/phone-home": Op(
        "write",
        "401: no job token (only the installed system's cloud-init seed has it)",
        lambda w, i: Req({"id": pick(w.job_ids, i)}, body={"instance_id": "karios-x"}, headers=NO_TOKEN),
        expect=(401,),
    ),
    "POST /controlnode/job/{id}/step": Op(
        "write",
        "401: no job token (only the boot medium has it)",
        lambda w, i: Req(
            {"id": pick(w.job_ids, i)}, body={"step": "partitioning", "state": "active"}, headers=NO_TOKEN
        ),
        expect=(401,),
    ),
    "GET /controlnode/jobs": Op("read", "valid: newest 100 of all jobs", lambda w, i: Req()),
    "GET /controlnode/nodes": Op(
        "read",
        "valid: pages of 100, offsets across the set",
        lambda w, i: Req(query={"offset": (i * 100) % max(w.nodes, 1), "limit": 100}),
    ),
    "POST /controlnode/nodes": Op(
        "write",
        "422: no SSH credentials (a valid adoption needs a reachable SSH server)",
        lambda w, i: Req(body={"node_ip": "192.0.2.10"}),
        expect=(422,),
    ),
    "DELETE /controlnode/nodes/{node_ip}": Op(
        "write",
        "valid: remove a seeded node (a fresh one each time)",
        lambda w, i: Req({"node_ip": w.victims[i]}),
        once=True,
    ),
    "GET /controlnode/nodes/{node_ip}": Op(
        "read", "valid", lambda w, i: Req({"node_ip": pick(w.node_ips, i)})
    ),
    "POST /controlnode/provision": Op(
        "write",
        "valid: provision a fresh inventory BMC (generic); the job fails at its BMC check",
        lambda w, i: Req(body=provision_body(w, "generic")),
        expect=(202,),
        settle=True,
        once=True,
    ),
    **{
        f"POST /controlnode/provision/{v}": _vendor_op(v)
        for v in ("cisco", "dell", "hp", "lenovo", "supermicro")
    },
    "POST /controlnode/provision/progress": Op(
        "read", "valid: a seeded job's BMC", lambda w, i: Req(body={"bmc_ip": pick(w.job_bmcs[: w.jobs], i)})
    ),
    "POST /controlnode/provision/progress/all": Op(
        "read", "valid: a seeded job's BMC", lambda w, i: Req(body={"bmc_ip": pick(w.job_bmcs[: w.jobs], i)})
    ),
    "GET /controlnode/provision/queue": Op("read", "valid", lambda w, i: Req()),
    "POST /controlnode/register": Op(
        "write",
        "valid: a seeded node registered again, same fields (idempotent)",
        lambda w, i: Req(body=w.registrations[(i * 7919) % len(w.registrations)]),
    ),
    "GET /controlnode/tokens": Op("read", "valid", lambda w, i: Req()),
    "POST /controlnode/tokens": Op(
        "write",
        "valid: a new viewer token each time",
        lambda w, i: Req(body={"name": f"bench-{w.run}-new-{i}", "role": "viewer"}),
        expect=(201,),
        once=True,
    ),
    "GET /controlnode/tokens/self": Op("read", "valid", lambda w, i: Req()),
    "DELETE /controlnode/tokens/{name}": Op(
        "write",
        "valid: revoke a seeded token (a fresh one each time)",
        lambda w, i: Req({"name": w.revoke[i]}),
        once=True,
    ),
    "POST /controlnode/tokens/{name}/rotate": Op(
        "write",
        "valid: rotate a seeded token",
        lambda w, i: Req({"name": w.rotate[i % len(w.rotate)]}, body={}),
    ),
    "POST /controlnode/unprovision": Op(
        "write",
        "valid: wipe a fresh inventory BMC; the job fails at its BMC check",
        lambda w, i: Req(body={"bmc_ip": w.next_fresh(), "vendor": "generic"}),
        expect=(202,),
        settle=True,
        once=True,
    ),
}

NOT_ONLY = "not in --only (not a failure)"

#: Operations measured with no request (none today): "METHOD path" -> the reason, printed.
SKIP: dict[str, str] = {}


def operations(doc: dict[str, Any] | None = None) -> list[str]:
    """Every operation of the published OpenAPI document, "METHOD path", in document order."""
    doc = doc or json.loads(OPENAPI.read_text())
    return [f"{m.upper()} {p}" for p, ops in doc["paths"].items() for m in ops if m in METHODS]


def fresh_needed(requests: int) -> int:
    """Fresh BMCs the provisioning routes use (warm-ups included)."""
    return sum(1 for k, op in OPS.items() if op.settle) * (requests + WARMUP)


# -- seeding through the API ------------------------------------------------------------------------


async def _gather(n: int, fn: Callable[[int], Awaitable[None]], conc: int = 16) -> None:
    sem = asyncio.Semaphore(conc)

    async def one(i: int) -> None:
        async with sem:
            await fn(i)

    await asyncio.gather(*(one(i) for i in range(n)))


def _ok(r: httpx.Response, *codes: int) -> httpx.Response:
    if r.status_code not in codes:
        raise RuntimeError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:400]}")
    return r


async def settle(c: httpx.AsyncClient, timeout: float = 600.0) -> float:
    """Wait until the provisioner's queue is empty (every job ended); seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = await c.get("/controlnode/provision/queue")
        if r.status_code == 200 and not r.json()["entries"]:
            return time.monotonic() - t0
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the provisioner's queue did not empty in {timeout:.0f} s")


async def seed(
    c: httpx.AsyncClient,
    w: World,
    *,
    nodes: int,
    jobs: int,
    requests: int,
    log: Callable[[str], None] = print,
) -> World:
    """Seed ``w`` through the API (``c``: the gateway, admin token)."""
    t0 = time.monotonic()
    w.nodes, w.jobs = nodes, jobs
    w.fabric_config = dict(FABRIC, expected_nodes=min(max(nodes, 12), 1000))
    _ok(await c.post("/controlnode/fabric-config", json=w.fabric_config), 200, 201)

    def registration(net: int, k: int) -> dict[str, Any]:
        return {
            "bmc_ip": ip(net - 1, k),
            "os_ip": ip(net, k),
            "os_hostname": f"node-{net}-{k}",
            "os_username": "root",
            "os_password": "bench-node-pw",
            "vendor": "generic",
        }

    w.registrations = [registration(3, k) for k in range(nodes)]
    w.node_ips = [r["os_ip"] for r in w.registrations]

    async def register(i: int) -> None:
        _ok(await c.post("/controlnode/register", json=w.registrations[i]), 200)

    await _gather(nodes, register)
    log(f"seed: {nodes} nodes registered ({time.monotonic() - t0:.0f} s)")

    # Jobs, in batches sharing a parent_id; each fails at its BMC check (no BMC answers).
    w.batches = [f"bench-batch-{w.run}-{b}" for b in range(math.ceil(jobs / BATCH))]

    async def provision(k: int) -> None:
        body = provision_body(w, ("generic", "dell", "hpe", "supermicro")[k % 4], k)
        body["parent_id"] = w.batches[k // BATCH]
        r = _ok(await c.post("/controlnode/provision", json=body), 202)
        job = r.json()["job_id"]
        w.job_ids.append(job)
        w.job_names[job], w.job_bmc_of[job] = body["hostname"], body["bmc_IP"]

    await _gather(jobs, provision)
    w.fresh = jobs
    log(f"seed: {jobs} jobs queued ({time.monotonic() - t0:.0f} s)")

    # Jobs the provisioner cancels while they wait for a BMC that never answers: POST …/cancel
    # cancels them again (idempotent, answered by the provisioner).
    hanging = []
    for k, bmc in enumerate(w.hanging):
        body = dict(provision_body(w, "generic", 0), bmc_IP=bmc, hostname=f"hang-{k}")
        hanging.append(_ok(await c.post("/controlnode/provision", json=body), 202).json()["job_id"])
    deadline = time.monotonic() + 120
    while True:  # the provisioner has them (its queue lists every job it has not ended)
        q = _ok(await c.get("/controlnode/provision/queue"), 200).json()
        if set(hanging) <= {e["job_id"] for e in q["entries"]}:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the provisioner does not list the jobs {hanging}: {q}")
        await asyncio.sleep(0.3)
    for job in hanging:
        _ok(await c.post(f"/controlnode/job/{job}/cancel"), 200)
    w.cancelled = hanging
    waited = await settle(c)
    log(f"seed: every job ended ({waited:.0f} s after the last POST; {time.monotonic() - t0:.0f} s)")

    # Tokens to revoke (one per request) and to rotate.
    w.revoke = [f"bench-{w.run}-revoke-{i}" for i in range(requests + WARMUP)]
    w.rotate = [f"bench-{w.run}-rotate-{i}" for i in range(8)]

    async def token(i: int) -> None:
        name = (w.revoke + w.rotate)[i]
        _ok(await c.post("/controlnode/tokens", json={"name": name, "role": "viewer"}), 201)

    await _gather(len(w.revoke) + len(w.rotate), token)

    # A fabric job (forced past blockers: every node refuses SSH) for /latest, then the preflight
    # that records the unreachable nodes as blockers (an apply is then refused with 409).
    r = _ok(await c.post("/controlnode/fabric-config/apply", params={"force": "true"}), 202)
    w.fabric_job = r.json()["apply_job_id"]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        latest = await c.get("/controlnode/fabric-config/latest")
        view = latest.json() if latest.status_code == 200 else {}
        if view.get("job_id") == w.fabric_job and view.get("job_status") != "running":
            break
        await asyncio.sleep(1.0)
    else:
        raise RuntimeError("the seeded fabric apply did not end in 600 s")
    _ok(await c.post("/controlnode/fabric-config/preflight", json={"underlay_cidr": "127.3.0.0/16"}), 200)
    log(f"seed: fabric apply {w.fabric_job} ended, preflight stored ({time.monotonic() - t0:.0f} s)")

    # Nodes the DELETE /nodes/{ip} route removes, one per request (apart from the fabric's set
    # used by the other routes, and registered after the apply: they hold no VTEP).
    victims = [registration(4, k) for k in range(requests + WARMUP)]

    async def victim(i: int) -> None:
        _ok(await c.post("/controlnode/register", json=victims[i]), 200)

    await _gather(len(victims), victim)
    w.victims = [v["os_ip"] for v in victims]
    w.nodes += len(victims)

    # Unknown machines booted into discovery mode report their hardware; a quarter adopted.
    if w.discovery_token is not None:
        for k in range(DISCOVERED):
            body = discovery_report(k)
            token = await w.discovery_token(body["boot_mac"])
            r = _ok(
                await c.post("/controlnode/discovery/report", json=body, headers={DISCOVERY_HEADER: token}),
                200,
            )
            w.discovered.append(r.json()["id"])
            w.reports.append((token, body))
        for k, d in enumerate(w.discovered[: DISCOVERED // 4]):
            w.adopted[d] = f"srv-bench-{k}"
            _ok(await c.post(f"/controlnode/discovered/{d}/adopt", json={"hostname": w.adopted[d]}), 200)
        log(f"seed: {DISCOVERED} servers discovered ({time.monotonic() - t0:.0f} s)")

    for bmc in w.emulated:  # a hardware record for GET …/hardware
        _ok(await c.post(f"/controlnode/bmc/{bmc}/inspect", json={"vendor": "generic"}, timeout=120), 200)
    log(f"seed: done in {time.monotonic() - t0:.0f} s")
    return w


# -- measuring --------------------------------------------------------------------------------------


@dataclass
class Row:
    key: str
    op: Op | None
    statuses: Counter[int] = field(default_factory=Counter)
    times: list[float] = field(default_factory=list)  # ms, timed requests only
    sizes: list[int] = field(default_factory=list)  # response body bytes, timed requests only
    skipped: str = ""
    errors: list[str] = field(default_factory=list)  # bodies of unexpected answers (first few)
    #: How the timed requests were sent: "N python" (concurrent httpx clients) or "N wrk".
    load: str = ""
    #: Percentiles measured outside this process (wrk): quantile -> ms; `times` is then empty.
    measured: dict[float, float] = field(default_factory=dict)
    count: int = 0  # timed requests answered
    note: str = ""  # what the measurement itself says (wrk: the prepared requests ran out)

    @property
    def method(self) -> str:
        return self.key.split(" ", 1)[0]

    @property
    def path(self) -> str:
        return self.key.split(" ", 1)[1]

    def pct(self, q: float) -> float:
        if q in self.measured:
            return self.measured[q]
        if not self.times:
            return float("nan")
        s = sorted(self.times)
        return s[max(0, math.ceil(q * len(s)) - 1)]

    @property
    def limit(self) -> tuple[float, str]:
        return limit_of(self.key, self.op.kind if self.op else "write")

    @property
    def unexpected(self) -> list[int]:
        want = self.op.expect if self.op else ()
        return sorted(s for s in self.statuses if s not in want)

    @property
    def server_errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500 or s == 0)

    @property
    def ok(self) -> bool:
        """Counts for the exit status: passed, or left out on purpose with --only."""
        return self.passed or self.skipped == NOT_ONLY

    @property
    def passed(self) -> bool:
        if self.skipped or not (self.times or self.measured):
            return False
        return not self.unexpected and self.pct(0.99) <= self.limit[0]


def _url(path: str, params: dict[str, str]) -> str:
    for k, v in params.items():
        path = path.replace("{" + k + "}", quote(str(v), safe=""))
    if "{" in path:
        raise ValueError(f"unfilled path parameter in {path}")
    return path


async def _one(c: httpx.AsyncClient, row: Row, w: World, i: int, timed: bool) -> None:
    op = row.op
    assert op is not None
    if op.setup is not None:
        await op.setup(c, w, i)
    req = op.make(w, i)
    url = _url(row.path, req.params)
    kw: dict[str, Any] = {"params": req.query, "headers": req.headers}
    if req.body is not None:
        kw["json"] = req.body
    t0 = time.perf_counter()
    try:
        if op.sse:
            async with c.stream(row.method, url, **kw) as r:
                status = r.status_code  # the headers are in: the stream is open
                ms = (time.perf_counter() - t0) * 1000
                text = "" if status == 200 else (await r.aread()).decode(errors="replace")
                size = len(text)
        else:
            r = await c.request(row.method, url, **kw)
            ms = (time.perf_counter() - t0) * 1000
            status, text, size = r.status_code, r.text, len(r.content)
    except httpx.HTTPError as exc:
        status, ms, text, size = 0, (time.perf_counter() - t0) * 1000, f"{type(exc).__name__}: {exc}", 0
    row.statuses[status] += 1
    if timed:
        row.times.append(ms)
        row.sizes.append(size)
    if status not in op.expect and len(row.errors) < 3:
        row.errors.append(f"{status} {text[:300]}")


async def measure(c: httpx.AsyncClient, row: Row, w: World, n: int, clients: int) -> None:
    """``WARMUP`` untimed requests, then ``n`` timed ones from ``clients`` concurrent clients."""
    for i in range(WARMUP):
        await _one(c, row, w, i, timed=False)
    row.statuses.clear()
    row.errors.clear()
    nxt = iter(range(WARMUP, WARMUP + n))

    async def client() -> None:
        for i in nxt:
            await _one(c, row, w, i, timed=True)

    await asyncio.gather(*(client() for _ in range(clients)))
    row.count, row.load = len(row.times), f"{clients} python"


# -- many connections: wrk -------------------------------------------------------------------------

#: One wrk thread: it sends tens of thousands of requests a second here, far more than any route
#: answers, and one request sequence needs no split between threads.
WRK_THREADS = 1


def on_wrk(row: Row) -> bool:
    """Whether ``--connections`` measures the row with wrk: a route held to the issue's limits
    (no own limit: those talk to BMCs or SSH to nodes, a few at a time by design), not an SSE
    stream, no untimed set-up per request, not one measured last at its own concurrency."""
    op = row.op
    return (
        op is not None
        and row.key not in LIMITS
        and not op.sse
        and op.setup is None
        and not op.last
        and op.clients is None
    )


def _lua(value: Any) -> str:
    """A Lua literal of a str / None / dict of str (JSON's escapes are Lua's for ASCII text)."""
    if value is None:
        return "nil"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{_lua(k)}] = {_lua(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value), ensure_ascii=True)


#: `once`: a connection whose answer came in when every request has been sent waits out the run
#: (an hour's delay) instead of being stopped, so the answers still in flight are all read.
ONCE_DELAY = """
function delay()
  if idx + promised >= #reqs then
    exhausted = true
    return 3600000
  end
  promised = promised + 1  -- this connection's next request() takes one
  return 0
end
"""


def wrk_script(requests: list[tuple[str, str, str | None, dict[str, str]]], once: bool, token: str) -> str:
    """A wrk script (one thread) sending `requests` (method, path with query, JSON body, headers)
    over its connections in order — cycling through them, or (`once`) each once, then waiting
    out the run (then "exhausted" is said; no more connections than requests). Counts the
    statuses and body bytes of the answers; ``done`` prints one ``KARIOS_WRK`` JSON line.

    wrk 4.1 calls ``request()`` once before the run to see whether the script pipelines, and
    never sends what that call returns: the first call is answered without taking a request
    (``tests/integration/test_every_route.py`` checks that each is sent exactly once)."""
    specs = ",\n".join(f"{{{_lua(m)}, {_lua(p)}, {_lua(b)}, {_lua(h)}}}" for m, p, b, h in requests)
    return f"""
local specs = {{
{specs}
}}
local once = {"true" if once else "false"}
local threads = {{}}
counts, bodybytes, exhausted, extra = {{}}, 0, false, 0
local reqs, idx, promised, filler, verified = {{}}, 0, 0, nil, false

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  for k, s in ipairs(specs) do
    local h = {{["Authorization"] = {_lua("Bearer " + token)}}}
    if s[3] ~= nil then h["Content-Type"] = "application/json" end
    for hk, hv in pairs(s[4]) do h[hk] = hv end
    reqs[k] = wrk.format(s[1], s[2], h, s[3])
  end
  filler = wrk.format("GET", "/healthz", {{}}, nil)
end

function request()
  if not verified then  -- wrk's look at the script before the run: not sent
    verified = true
    return reqs[1]
  end
  if promised > 0 then promised = promised - 1 end
  if once and idx >= #reqs then  -- delay() holds connections first; a reconnect does not ask it
    extra = extra + 1
    return filler
  end
  idx = idx + 1
  return reqs[(idx - 1) % #reqs + 1]
end
{ONCE_DELAY if once else ""}
function response(status, headers, body)
  local k = tostring(status)
  counts[k] = (counts[k] or 0) + 1
  bodybytes = bodybytes + #(body or "")
end

function done(summary, latency, requests)
  local c, bytes, ran_out, fillers = {{}}, 0, false, 0
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("counts")) do c[k] = (c[k] or 0) + v end
    bytes = bytes + t:get("bodybytes")
    ran_out = ran_out or t:get("exhausted")
    fillers = fillers + t:get("extra")
  end
  local parts = {{}}
  for k, v in pairs(c) do table.insert(parts, string.format('"%s": %d', k, v)) end
  local e = summary.errors
  io.write(string.format(
    'KARIOS_WRK {{"requests": %d, "p50_us": %d, "p99_us": %d, "max_us": %d, "body_bytes": %d, ' ..
    '"statuses": {{%s}}, "socket_errors": %d, "timeouts": %d, "exhausted": %s, "fillers": %d}}\\n',
    summary.requests, math.floor(latency:percentile(50)), math.floor(latency:percentile(99)),
    math.floor(latency.max), bytes,
    table.concat(parts, ", "), e.connect + e.read + e.write, e.timeout, tostring(ran_out), fillers))
end
"""


def run_wrk(
    url: str,
    token: str,
    prepared: list[tuple[str, str, str | None, dict[str, str]]],
    *,
    once: bool,
    connections: int,
    seconds: float,
) -> dict[str, Any]:
    """:func:`wrk_script` run by wrk against `url`; what its ``done`` printed."""
    if once:  # each connection's first request is sent without asking delay(): one each at most
        connections = max(1, min(connections, len(prepared)))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="karios-route-") as f:
        f.write(wrk_script(prepared, once, token))
        f.flush()
        argv = ["wrk", f"-t{WRK_THREADS}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s"]
        out = subprocess.run([*argv, "-s", f.name, url.rstrip("/")], capture_output=True, text=True)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("KARIOS_WRK ")), None)
    if out.returncode != 0 or line is None:
        said = out.stderr[-500:] or out.stdout[-500:]
        raise RuntimeError(f"wrk on {url} failed ({out.returncode}): {said}")
    return json.loads(line.removeprefix("KARIOS_WRK "))  # type: ignore[no-any-return]


def wrk_measure(
    c: httpx.AsyncClient, row: Row, w: World, *, requests: int, connections: int, seconds: float
) -> None:
    """The row's requests ``WARMUP``.. prepared by its ``make`` (a ``once`` route: as many as its
    pool holds, else up to `requests` distinct ones, cycled), sent by ``wrk`` over `connections`
    connections for `seconds`. wrk's own CPU per request is a few µs (httpx's a few hundred): at
    100 connections a Python client would measure itself."""
    op = row.op
    assert op is not None
    prepared: list[tuple[str, str, str | None, dict[str, str]]] = []
    for i in range(WARMUP, WARMUP + requests):
        try:
            req = op.make(w, i)
        except IndexError:  # a `once` pool ran out: send what there is
            break
        path = _url(row.path, req.params)
        if req.query:
            path += "?" + urlencode(req.query)
        body = None if req.body is None else json.dumps(req.body, separators=(",", ":"))
        prepared.append((row.method, path, body, dict(req.headers or {})))
    if not prepared:
        raise RuntimeError(f"{row.key}: no request left in its pool (seed more: --requests)")
    token = str(c.headers["Authorization"]).removeprefix("Bearer ")
    got = run_wrk(str(c.base_url), token, prepared, once=op.once, connections=connections, seconds=seconds)
    row.statuses.clear()
    row.statuses.update({int(k): n for k, n in got["statuses"].items()})
    if got["socket_errors"] or got["timeouts"]:
        row.statuses[0] += got["socket_errors"] + got["timeouts"]
        row.errors.append(f"wrk: {got['socket_errors']} socket errors, {got['timeouts']} timeouts (> 10 s)")
    row.count = int(got["requests"])
    row.measured = {0.5: got["p50_us"] / 1000, 0.99: got["p99_us"] / 1000}
    row.sizes = [int(got["body_bytes"] / max(row.count, 1))]
    row.load = f"{connections} wrk"
    if got["fillers"]:  # reconnects after every request was sent: GET /healthz in the counts
        row.errors.append(f"wrk: {got['fillers']} GET /healthz sent after the prepared requests ran out")
    if got["exhausted"]:
        row.note = f"each of the {len(prepared)} prepared requests sent once, within {seconds:g} s"


async def measure_all(
    c: httpx.AsyncClient,
    w: World,
    *,
    requests: int,
    clients: int,
    only: set[str] | None = None,
    doc: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    connections: int = 0,
    seconds: float = 3.0,
) -> list[Row]:
    """One row per operation of the OpenAPI document (and one per request maker it lacks)."""
    keys = operations(doc)
    rows = [Row(k, OPS.get(k)) for k in keys]
    for row in rows:
        if row.op is None:
            row.skipped = SKIP.get(
                row.key, "NOT EXERCISED: no request for it in benchmarks/every_route.py OPS"
            )
        elif row.op.needs_bmc and not w.emulated:
            row.skipped = "no BMC emulator (sushy-tools) on this machine"
        elif row.op.needs_discovery and w.discovery_token is None:
            row.skipped = "no discovery tokens (bootapi discovery off)"
        elif only and row.key not in only:
            row.skipped = NOT_ONLY
    rows += [
        Row(k, OPS[k], skipped="in OPS but not in the OpenAPI document (stale)") for k in OPS if k not in keys
    ]
    todo = sorted((r for r in rows if not r.skipped), key=lambda r: r.op.last if r.op else False)
    for row in todo:
        op = row.op
        assert op is not None
        n = min(op.n or requests, requests)
        t0 = time.monotonic()
        if connections and on_wrk(row):
            for i in range(WARMUP):  # untimed, as below; then the prepared requests from WARMUP
                await _one(c, row, w, i, timed=False)
            row.errors.clear()
            await asyncio.to_thread(
                wrk_measure, c, row, w, requests=n, connections=connections, seconds=seconds
            )
        else:
            await measure(c, row, w, n, min(op.clients or clients, clients))
        waited = await settle(c) if op.settle else 0.0
        log(
            f"  {row.key} ({row.load}): {dict(row.statuses)} p99 {row.pct(0.99):.1f} ms "
            f"({time.monotonic() - t0 - waited:.1f} s{f', settled in {waited:.0f} s' if waited else ''})"
        )
    return rows


def table(rows: list[Row]) -> str:
    fmt = "| {:<58} | {:<6} | {:<11} | {:>10} | {:>5} | {:>8} | {:>8} | {:>6} | {:>6} | {:<4} | {:>6} | {}"
    head = ("route", "method", "status seen", "load", "n", "p50 ms", "p99 ms", "limit", "ratio", "pass", "KB")
    head += ("request",)
    widths = (58, 6, 11, 10, 5, 8, 8, 6, 6, 4, 6, 7)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    special: dict[str, str] = {}
    for r in rows:
        lim, why = r.limit
        if r.key in LIMITS:
            special[r.key] = f"{r.key}: {lim:.0f} ms, {why}"
        if r.skipped:
            skip = (r.path, r.method, "-", "-", 0, "-", "-", f"{lim:.0f}", "-", "SKIP", "-", r.skipped)
            out.append(fmt.format(*skip))
            continue
        seen = ",".join(f"{s}" if len(r.statuses) == 1 else f"{s}x{k}" for s, k in sorted(r.statuses.items()))
        verdict = "ok" if r.passed else ("FAIL" if not r.unexpected else "FAIL (status)")
        assert r.op is not None
        out.append(
            fmt.format(
                r.path,
                r.method,
                seen,
                r.load,
                r.count,
                f"{r.pct(0.5):.1f}",
                f"{r.pct(0.99):.1f}",
                f"{lim:.0f}",
                f"{r.pct(0.99) / lim:.2f}",
                verdict,
                f"{sum(r.sizes) / len(r.sizes) / 1024:.1f}" if r.sizes else "-",
                f"{r.op.kind}; {r.op.request}" + (f" [{r.note}]" if r.note else ""),
            )
        )
    failed = [r for r in rows if not r.ok]
    out.append("")
    out.append(
        f"{len(rows)} operations, {sum(1 for r in rows if r.passed)} pass, "
        f"{len(failed)} fail or not exercised. "
        f"limits (p99): reads {LIMITS['read'][0]:.0f} ms, writes {LIMITS['write'][0]:.0f} ms; "
        "ratio = p99 / limit; KB: mean response body (SSE: none, the stream is closed at its headers); "
        "load: concurrent connections and the client that held them (wrk, or httpx clients in this process)"
    )
    for load in sorted({r.load for r in rows if r.load and not r.skipped}):
        mine = [r for r in rows if r.load == load and not r.skipped]
        out.append(f"  at {load}: {sum(1 for r in mine if r.passed)} of {len(mine)} within their limits")
    out += [f"  own limit: {s}" for s in special.values()]
    for r in rows:
        for e in r.errors:
            out.append(f"  unexpected answer, {r.key}: {e}")
    return "\n".join(out)


# -- the system: karios up, the Redfish emulator ------------------------------------------------------

BMC_PASSWORD = "bench-bmc-pw"


class Blackhole:
    """A TCP port that accepts connections (the kernel's backlog) and never answers: a BMC whose
    jobs wait for it, so that the provisioner has jobs to cancel."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"

    def endpoints(self, bmcs: list[str]) -> dict[str, dict[str, str]]:
        return {bmc: {"url": self.url, "system_id": "1"} for bmc in bmcs}

    def close(self) -> None:
        self.sock.close()


def inventory(bmcs: list[str]) -> dict[str, Any]:
    devices = [
        {
            "id": k + 1,
            "name": f"bench-{k}",
            "oob_ip": bmc,
            "disks": [{"name": "sda", "size_gb": 480}, {"name": "sdb", "size_gb": 480}],
            "interfaces": [
                {"name": "eno1", "macs": [f"52:54:03:{k >> 16 & 255:02x}:{k >> 8 & 255:02x}:{k & 255:02x}"]}
            ],
        }
        for k, bmc in enumerate(bmcs)
    ]
    return {"devices": devices}


def emulator(count: int = 2) -> Any:
    """A sushy-tools emulator (tests/lab/redfish_lab.py) with ``count`` servers that report CPUs,
    memory, BIOS and two drives, as test_hardware.py's: an emulated system without them answers
    500/501 for those collections, which the driver retries with backoff (seconds per inspection)."""
    sys.path.insert(0, str(ROOT))
    from tests.lab.redfish_lab import FAKE_HARDWARE, RedfishEmulator, fake_system

    cpu = {"vendor": "Intel(R) Corporation", "model": "Xeon Gold 6354", "cores": 18, "threads": 36}
    systems = [
        fake_system(
            f"bench-bmc{k}",
            power_state="On",
            processors=[{"id": f"CPU{n}", "Id": f"CPU{n}", "socket": f"CPU {n}", **cpu} for n in (1, 2)],
            total_cpus=2,
            total_memory_gb=256,
            bios_version="2.4.1",
        )
        for k in range(count)
    ]
    storage = {
        s["uuid"]: [{"Id": "1", "Name": "Local Storage Controller", "Drives": ["D1", "D2"]}] for s in systems
    }
    drives = {
        (s["uuid"], "1"): [
            {"Id": f"D{n}", "Name": f"Drive {n}", "CapacityBytes": 480_103_981_056, "Protocol": "SATA"}
            for n in (1, 2)
        ]
        for s in systems
    }
    extra = {"SUSHY_EMULATOR_STORAGE": storage, "SUSHY_EMULATOR_DRIVES": drives}
    return RedfishEmulator(systems, password=BMC_PASSWORD, prelude=FAKE_HARDWARE, extra_config=extra)


def start_emulator() -> Any | None:
    try:
        return emulator().start()
    except Exception as exc:
        print(f"no Redfish emulator ({exc}): the BMC routes are listed as skipped")
        return None


class System(KariosUp):
    """``karios up`` on free ports, the run's file inventory, a database of its own."""

    def __init__(self, bmcs: list[str], endpoints: dict[str, dict[str, str]]) -> None:
        env = {
            "KARIOS_PROVISIONER_BMC_ENDPOINTS": json.dumps(endpoints, separators=(",", ":")),
            "KARIOS_PROVISIONER_BMC_USER": "admin",
            "KARIOS_PROVISIONER_BMC_PASSWORD": BMC_PASSWORD,
            "BMC_USER": "admin",
            "BMC_PASSWORD": BMC_PASSWORD,
            "BOOTAPI_DISCOVERY_ENABLED": "true",  # an unknown MAC boots into discovery, with a token
            "BOOTAPI_DISCOVERY_TOKEN_TTL": "6h",  # the report route is measured long after the seed
        }
        super().__init__("routes", inventory(bmcs), env, attempts=3)

    async def discovery_token(self, mac: str) -> str:
        """The token bootapi puts on the kernel line of an unknown MAC's discovery boot."""
        async with httpx.AsyncClient(timeout=30) as c:
            script = (await c.get(f"{self.url('BOOTAPI')}/ipxe/{mac}")).text
        found = re.search(r"karios\.discovery=([A-Za-z0-9_.-]+)", script)
        if found is None:
            raise RuntimeError(f"bootapi gave {mac} no discovery boot:\n{script[:500]}")
        return found.group(1)

    def pid_of(self, service: str) -> int | None:
        try:
            return int(self.process_of(service).pid)
        except LookupError:
            return None


async def run(a: argparse.Namespace, s: System, w: World) -> list[Row]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    conns = a.connections if a.connections and not ensure_debian_tools(("wrk", "/usr/bin/wrk")) else 0
    headers = {"Authorization": f"Bearer {s.token}"}
    async with httpx.AsyncClient(base_url=s.url(), headers=headers, timeout=120, limits=limits) as c:
        await seed(c, w, nodes=a.nodes, jobs=a.jobs, requests=a.requests)
        only = {k.strip() for k in a.only.split(",") if k.strip()} if a.only else None
        print(
            f"measuring: {a.requests} requests per route, {a.clients} clients"
            + (
                f" ({conns} connections by wrk for {a.seconds:g} s where the issue's limits hold)"
                if conns
                else ""
            )
            + f"; load {os.getloadavg()[0]:.1f}"
        )
        if a.connections and not conns:
            print(
                "no wrk on this machine (apt-get install wrk, as root): every route measured by httpx clients"
            )
        return await measure_all(
            c, w, requests=a.requests, clients=a.clients, only=only, connections=conns, seconds=a.seconds
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300, help="timed requests per route")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients per route (httpx)")
    ap.add_argument(
        "--connections",
        type=int,
        default=100,
        help="connections wrk holds on a route held to the issue's limits (0: httpx clients for every route)",
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="how long wrk loads each such route")
    ap.add_argument(
        "--nodes",
        type=int,
        default=1000,
        help="registered nodes with an OS address: the fabric's nodes (its planner sizes up to 1,000)",
    )
    ap.add_argument("--jobs", type=int, default=2000, help="provisioning jobs to seed")
    ap.add_argument("--only", default="", help="comma-separated 'METHOD path' to measure (others: skipped)")
    ap.add_argument("--keep", action="store_true", help="keep the state dir (logs)")
    a = ap.parse_args()
    w = World(
        job_bmcs=[ip(1, k) for k in range(a.jobs + fresh_needed(a.requests))],
        emulated=[],
        hanging=[ip(7, k) for k in range(HANGING)],
    )
    hole = Blackhole()
    emu = start_emulator()
    emulated: dict[str, dict[str, str]] = {}
    if emu is not None:
        emulated = {
            ip(6, k): {"url": emu.url, "system_id": sid, "username": "admin", "password": BMC_PASSWORD}
            for k, sid in enumerate(emu.system_ids)
        }
    w.emulated = list(emulated)
    try:
        t0 = time.monotonic()
        bmcs = w.job_bmcs + w.emulated + w.hanging
        s = System(bmcs, emulated | hole.endpoints(w.hanging))
        print(
            f"karios up ready in {time.monotonic() - t0:.0f} s; {os.cpu_count()} CPUs, load "
            f"{os.getloadavg()[0]:.1f}; {len(bmcs)} inventory devices"
        )
        w.discovery_token = s.discovery_token
        try:
            rows = asyncio.run(run(a, s, w))
        finally:
            s.stop(keep=a.keep)
    finally:
        hole.close()
        if emu is not None:
            emu.stop()
    print(
        f"\nEvery gateway route, {a.requests} requests per route (fewer where n says), {a.clients} clients"
        f" (wrk: {a.connections} connections for {a.seconds:g} s), "
        f"{a.nodes} nodes / {a.jobs} jobs seeded; load {os.getloadavg()[0]:.1f}\n"
    )
    print(table(rows))
    sys.exit(0 if all(r.ok for r in rows) else 1)


if __name__ == "__main__":
    main()
