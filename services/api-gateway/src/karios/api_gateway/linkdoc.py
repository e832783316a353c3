"""OpenAPI links between the gateway's operations (issue 24 item 8).

Where a response names a resource another operation takes (the 202 of a provision names its job,
a created token its name, a registration its BMC, a discovery report its server, a fabric apply its
job), the response says so with an OpenAPI `link`: a client (and schemathesis' stateful phase,
which follows links to fuzz sequences: provision → the job → its callbacks → cancel) learns the
next call from the document instead of from prose.

Every link is one row of :data:`LINKS`: source operation, status, link name, target operation,
then the target's parameters (``"<in>.<name>"`` → runtime expression) and/or a body merged into
the target's request body (expressions at its leaves, e.g. the BMC IP of the request that started
the job). Operations are "METHOD /path" under ``/controlnode``, resolved to their operationId by
:func:`add_links`: a row naming an operation, response or parameter the document does not have
fails the document's build (so ``test_published_contracts``) instead of leaving a dangling link.

The installer callbacks (step, complete, firstboot) and the discovery report take a job /
discovery token no response carries (by design: it travels on the boot medium only); their links
name the job or BMC, the caller brings the token.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from fastapi import FastAPI

from karios.api_gateway.routes.provision import VENDOR_ROUTES

PREFIX = "/controlnode"
_METHODS = {"get", "put", "post", "delete", "patch"}


class Link(NamedTuple):
    source: str  # "METHOD /path" (under /controlnode) whose response names the resource
    status: str  # the documented response that carries it
    name: str
    target: str  # "METHOD /path" of the operation that takes it
    parameters: dict[str, str] = {}  # "<in>.<name>" of the target → runtime expression
    body: dict[str, Any] | str | None = None  # merged into the target's request body
    description: str = ""


# Expressions used by many rows
JOB = "$response.body#/job_id"  # Accepted (202 of a provision), JobView (callbacks, cancel)
NODE = "$response.body#/node_ip"
_JOB = {"path.id": JOB}
_NODE = {"path.node_ip": NODE}
_NAME = {"path.name": "$response.body#/name"}

# Operations used by many rows
PROVISION, UNPROVISION, REGISTER = "POST /provision", "POST /unprovision", "POST /register"
JOB_GET, JOB_PATCH, JOB_CANCEL = "GET /job/{id}", "PATCH /job/{id}", "POST /job/{id}/cancel"
STEP, COMPLETE, FIRSTBOOT = "POST /job/{id}/step", "POST /job/{id}/complete", "POST /firstboot"
PROGRESS, PROGRESS_ALL, JOBS = "POST /provision/progress", "POST /provision/progress/all", "GET /jobs"
BATCH = "GET /fabric-config/batches/{batch_id}/postdeploy"
NODE_GET, NODES_POST, NODE_DELETE = "GET /nodes/{node_ip}", "POST /nodes", "DELETE /nodes/{node_ip}"
INSPECT, HARDWARE = "POST /bmc/{bmc_ip}/inspect", "GET /bmc/{bmc_ip}/hardware"
TOKENS = "POST /tokens"
REPORT, DISCOVERED = "POST /discovery/report", "GET /discovered/{id}"
ADOPT = "POST /discovered/{id}/adopt"
FABRIC, PLAN, PREFLIGHT = "POST /fabric-config", "POST /fabric-config/plan", "POST /fabric-config/preflight"
APPLY, APPLY_NODE = "POST /fabric-config/apply", "POST /fabric-config/node/{node_ip}/apply"
CANCEL_APPLY, LATEST = "POST /fabric-config/apply/{job_id}/cancel", "GET /fabric-config/latest"
NODE_DRIFT, NODE_POSTDEPLOY = (
    "GET /fabric-config/drift/{node_ip}",
    "GET /fabric-config/node/{node_ip}/postdeploy",
)


def _queued_job(source: str, bmc: str) -> list[Link]:
    """A 202 that queued a provisioning job: the job, its callbacks, its BMC (``bmc``: where the
    request names it)."""
    return [
        Link(source, "202", "GetJob", JOB_GET, _JOB, description="The queued job"),
        Link(source, "202", "CancelJob", JOB_CANCEL, _JOB, description="Cancel it"),
        Link(source, "202", "PatchJob", JOB_PATCH, _JOB, description="Annotate it"),
        Link(source, "202", "ReportStep", STEP, _JOB, description="Its installer's step report (job token)"),
        Link(
            source,
            "202",
            "ReportComplete",
            COMPLETE,
            _JOB,
            description="Its installer's last report (job token)",
        ),
        Link(
            source, "202", "Progress", PROGRESS, body={"bmc_ip": bmc}, description="The BMC's latest progress"
        ),
        Link(source, "202", "JobsOfBmc", JOBS, {"query.bmc_ip": bmc}, description="The BMC's jobs"),
        Link(source, "202", "BatchPostdeploy", BATCH, {"path.batch_id": JOB}, description="Its checklist"),
    ]


def _rows() -> list[Link]:
    bmc_ip, bmc_of_provision = "$request.body#/bmc_ip", "$request.body#/bmc_IP"
    rows = _queued_job(PROVISION, bmc_of_provision) + _queued_job(UNPROVISION, bmc_ip)
    rows += [
        Link(PROVISION, "202", "ReportFirstboot", FIRSTBOOT, body={"bmc_ip": bmc_of_provision},
             description="The installed system's first boot (job token)"),
        Link(PROVISION, "202", "ProgressAll", PROGRESS_ALL, body={"bmc_ip": bmc_of_provision}),
        Link(PROVISION, "202", "Unprovision", UNPROVISION, body={"bmc_ip": bmc_of_provision},
             description="Wipe the server (409 while this job runs)"),
    ]  # fmt: skip
    for vendor in VENDOR_ROUTES:  # the same 202 and job as POST /provision
        rows += [
            Link(f"POST /provision/{vendor}", "202", "GetJob", JOB_GET, _JOB, description="The queued job"),
            Link(f"POST /provision/{vendor}", "202", "CancelJob", JOB_CANCEL, _JOB, description="Cancel it"),
        ]
    rows += [
        # jobs and their callbacks
        Link(JOBS, "200", "GetJob", JOB_GET, {"path.id": "$response.body#/items/0/id"}),
        Link(JOB_GET, "200", "CancelJob", JOB_CANCEL, {"path.id": "$response.body#/id"}),
        Link(JOB_GET, "200", "Progress", PROGRESS, body={"bmc_ip": "$response.body#/bmc_ip"}),
        Link(JOB_CANCEL, "200", "GetJob", JOB_GET, _JOB, description="The job, cancelled"),
        Link(STEP, "200", "GetJob", JOB_GET, _JOB),
        Link(STEP, "200", "ReportComplete", COMPLETE, {"path.id": "$request.path.id"}),
        Link(COMPLETE, "200", "GetJob", JOB_GET, _JOB),
        Link(COMPLETE, "200", "ReportFirstboot", FIRSTBOOT, body={"bmc_ip": "$response.body#/bmc_ip"}),
        Link(FIRSTBOOT, "200", "GetJob", JOB_GET, _JOB),
        Link(FIRSTBOOT, "200", "GetNode", NODE_GET, {"path.node_ip": "$request.body#/os_ip"},
             description="The compute node the first boot registered"),
        # tokens
        Link(TOKENS, "201", "RevokeToken", "DELETE /tokens/{name}", _NAME),
        Link(TOKENS, "201", "RotateToken", "POST /tokens/{name}/rotate", _NAME),
        # registered BMCs and their hardware (no GetNode: node_ip is "" when no os_ip was given,
        # and GET /nodes/ is the list)
        Link(REGISTER, "200", "Provision", PROVISION, body={"bmc_IP": bmc_ip}, description="Provision it"),
        Link(REGISTER, "200", "Unprovision", UNPROVISION, body={"bmc_ip": bmc_ip}, description="Wipe it"),
        Link(REGISTER, "200", "Inspect", INSPECT, {"path.bmc_ip": bmc_ip}, description="Read its hardware"),
        Link(REGISTER, "200", "Hardware", HARDWARE, {"path.bmc_ip": bmc_ip}),
        Link(REGISTER, "200", "Disks", "GET /bmc/{bmc_ip}/disks", {"path.bmc_ip": bmc_ip}),
        Link(REGISTER, "200", "Gpus", "GET /bmc/{bmc_ip}/gpus", {"path.bmc_ip": bmc_ip}),
        Link(REGISTER, "200", "BatchPostdeploy", BATCH, {"path.batch_id": bmc_ip},
             description="Its post-deployment checklist (a node by its BMC IP is a batch of one)"),
        Link(INSPECT, "200", "Hardware", HARDWARE, {"path.bmc_ip": "$response.body#/bmc_ip"}),
        Link(INSPECT, "200", "Provision", PROVISION, body={"bmc_IP": "$response.body#/bmc_ip"}),
        Link("POST /bmc/{bmc_ip}/firmware-update", "202", "GetFirmwareUpdate",
             "GET /bmc/{bmc_ip}/firmware-updates/{update_id}",
             {"path.bmc_ip": "$response.body#/bmc_ip", "path.update_id": "$response.body#/id"},
             description="Its progress and, once ended, the versions before and after"),
        Link(INSPECT, "200", "HardwareDiff", "GET /bmc/{bmc_ip}/hardware/diff",
             {"path.bmc_ip": "$response.body#/bmc_ip"},
             description="The record against the inventory's: what differs"),
        Link(HARDWARE, "200", "HardwareDiff", "GET /bmc/{bmc_ip}/hardware/diff",
             {"path.bmc_ip": "$response.body#/bmc_ip"},
             description="The record against the inventory's: what differs"),
        Link(HARDWARE, "200", "UpdateFirmware", "POST /bmc/{bmc_ip}/firmware-update",
             {"path.bmc_ip": "$response.body#/bmc_ip"},
             description="Update a component (targets: its firmware[].uri)"),
        Link("GET /bmc-tls", "200", "ClearPin", "DELETE /bmc-tls/{bmc_ip}",
             {"path.bmc_ip": "$response.body#/pins/0/bmc_ip"}),
        # compute nodes
        Link(NODES_POST, "201", "GetNode", NODE_GET, _NODE, description="The adopted node"),
        Link(NODES_POST, "201", "RemoveNode", NODE_DELETE, _NODE, description="Release it"),
        Link(NODES_POST, "201", "TeardownNode", "DELETE /fabric-config/node/{node_ip}", _NODE),
        Link("GET /nodes", "200", "GetNode", NODE_GET, {"path.node_ip": "$response.body#/items/0/node_ip"}),
        Link(NODE_DELETE, "200", "GetNode", NODE_GET, _NODE, description="404 once released"),
    ]  # fmt: skip
    for source, status in ((NODES_POST, "201"), (NODE_GET, "200")):
        rows += [
            Link(source, status, "NodeDrift", NODE_DRIFT, _NODE),
            Link(source, status, "NodePostdeploy", NODE_POSTDEPLOY, _NODE),
            Link(source, status, "ApplyNode", APPLY_NODE, _NODE),
            Link(source, status, "DiffNode", "POST /fabric-config/diff", {"query.node_ip": NODE}),
        ]
    server, first = {"path.id": "$response.body#/id"}, {"path.id": "$response.body#/0/id"}
    rows += [
        # servers found by discovery
        Link(REPORT, "200", "GetDiscovered", DISCOVERED, server, description="The server recorded"),
        Link(REPORT, "200", "Adopt", ADOPT, server, description="Adopt it"),
        Link("GET /discovered", "200", "GetDiscovered", DISCOVERED, first),
        Link("GET /discovered", "200", "Adopt", ADOPT, first),
        Link(DISCOVERED, "200", "Adopt", ADOPT, server),
        Link(ADOPT, "200", "GetDiscovered", DISCOVERED, {"path.id": "$response.body#/server/id"}),
    ]
    stored = {k: f"$response.body#/{k}" for k in ("router_id_base", "router_id_prefix_len", "expected_nodes")}
    for status in ("200", "201"):  # the fabric configuration: updated / created
        rows += [
            Link(FABRIC, status, "GetConfig", "GET /fabric-config", description="The stored configuration"),
            Link(FABRIC, status, "Plan", PLAN, body="$request.body", description="Dry-run what was stored"),
            Link(FABRIC, status, "Preflight", PREFLIGHT, body=stored, description="Preflight its VTEP pool"),
            Link(FABRIC, status, "Apply", APPLY, description="Roll it out"),
            Link(FABRIC, status, "VtepPool", "GET /fabric-config/vtep-pool"),
            Link(FABRIC, status, "Drift", "GET /fabric-config/drift"),
        ]
    apply_job = {"path.job_id": "$response.body#/apply_job_id"}
    first_node = {"path.node_ip": "$response.body#/nodes/0/node_ip"}
    rows += [
        Link(PLAN, "200", "Store", FABRIC, body="$request.body", description="Commit the dry run"),
        Link(PREFLIGHT, "200", "Apply", APPLY, description="Roll out after the preflight"),
        Link(PREFLIGHT, "200", "NodeDrift", NODE_DRIFT, first_node),
        Link(APPLY, "202", "CancelApply", CANCEL_APPLY, apply_job, description="Cancel the apply"),
        Link(APPLY, "202", "LatestJob", LATEST, description="The apply's job"),
        Link(APPLY_NODE, "202", "CancelApply", CANCEL_APPLY, apply_job),
        Link(APPLY_NODE, "202", "NodePostdeploy", NODE_POSTDEPLOY, {"path.node_ip": "$request.path.node_ip"}),
        Link(LATEST, "200", "CancelApply", CANCEL_APPLY, {"path.job_id": JOB}),
        Link("DELETE /fabric-config", "200", "LatestJob", LATEST, description="The teardown's job"),
        Link("GET /fabric-config/drift", "200", "NodeDrift", NODE_DRIFT, first_node),
        Link("GET /audit", "200", "NextPage", "GET /audit", {"query.before": "$response.body#/next_before"},
             description="The next (older) page"),
    ]  # fmt: skip
    return rows


LINKS: tuple[Link, ...] = tuple(_rows())


def _operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        f"{method.upper()} {path}": op
        for path, ops in doc.get("paths", {}).items()
        for method, op in ops.items()
        if method in _METHODS
    }


def _resolve(ops: dict[str, dict[str, Any]], name: str, link: Link) -> dict[str, Any]:
    method, path = name.split(" ", 1)
    op = ops.get(f"{method} {PREFIX}{path}")
    if op is None:
        raise ValueError(f"link {link.name} of {link.source}: no operation {name}")
    return op


def add_links(doc: dict[str, Any], links: tuple[Link, ...] = LINKS) -> dict[str, Any]:
    """Write ``links`` into the responses of ``doc`` (idempotent). A row naming an operation,
    response or parameter the document does not have is a ValueError naming the row."""
    ops = _operations(doc)
    seen: set[tuple[str, str, str]] = set()
    for link in links:
        source, target = _resolve(ops, link.source, link), _resolve(ops, link.target, link)
        where = f"link {link.name} of {link.source} {link.status}"
        if (link.source, link.status, link.name) in seen:
            raise ValueError(f"{where}: twice")
        seen.add((link.source, link.status, link.name))
        response = source.get("responses", {}).get(link.status)
        if response is None:
            raise ValueError(f"{where}: no such response")
        missing = set(link.parameters) - {f"{p['in']}.{p['name']}" for p in target.get("parameters", [])}
        if missing:
            raise ValueError(f"{where}: {link.target} has no parameter {sorted(missing)}")
        if link.body is not None and "requestBody" not in target:
            raise ValueError(f"{where}: {link.target} takes no body")
        definition: dict[str, Any] = {"operationId": target["operationId"]}
        if link.parameters:
            definition["parameters"] = dict(link.parameters)
        if link.body is not None:
            definition["requestBody"] = link.body
        if link.description:
            definition["description"] = link.description
        response.setdefault("links", {})[link.name] = definition
    return doc


def document_links(app: FastAPI) -> None:
    """Wrap ``app.openapi`` so the document carries :data:`LINKS`."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        return add_links(base())

    app.openapi = openapi  # type: ignore[method-assign]
