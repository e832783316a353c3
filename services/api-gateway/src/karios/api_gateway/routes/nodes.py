"""Compute nodes of the fabric (not in the seed; no seed path changes): adopt an installed node
by OS address and SSH credentials, list, show and remove them. Owned by the inventory; the
fabric worker pins the host key on first contact.

``POST /controlnode/register`` stays the seed's control-node registration (by BMC).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.readcache import node_key_of, nodes_page_key, read_cache
from karios.common.contracts.nodes import (
    AdoptNode,
    ComputeNode,
    ComputeNodePage,
    ComputeNodeQuery,
    ComputeNodesQuery,
    RemoveComputeNode,
    host_key_fingerprint,
    password_context,
    private_key_context,
)
from karios.common.crypto import SecretBox
from karios.common.devicetext import check_hostname, check_username
from karios.common.errors import ValidationFailed
from karios.common.http import ErrorResponse
from karios.common.limits import IP_MAX, IP_SCHEMA, BoundedIP, HostName, Name, OptBoundedIP, SshPassword, Text
from karios.common.netaddr import host_address_problem, normalize_ip

router = APIRouter(prefix="/controlnode", tags=["nodes"])
CONNECT_TIMEOUT = 10.0


def _err(text: str) -> dict:
    return {"model": ErrorResponse, "description": text}


_COMMON = {
    401: _err("No or unknown token"),
    403: _err("The token's role may not do this"),
    503: _err("Inventory or fabric worker unavailable"),
}


class AdoptRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_ip: BoundedIP = Field(description="OS (SSH) address of the installed node; the key of the node")
    ssh_username: Name = Field("root", description="SSH user (the fabric needs root or passwordless sudo)")
    ssh_password: SshPassword | None = Field(
        None, description="SSH password (write-only; encrypted at rest; SASLprep must take it)"
    )
    ssh_private_key: Text | None = Field(
        None, description="Unencrypted OpenSSH/PEM private key (write-only; encrypted at rest)"
    )
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port")
    hostname: HostName | None = Field(None, description="Hostname shown in lists and events")
    bmc_ip: OptBoundedIP = Field(None, description="BMC address, if the node has one Karios knows")
    ssh_host_key_fingerprint: Text | None = Field(
        None,
        description="The SSH host key the node must present: its SHA256 fingerprint as `ssh-keygen -lf` "
        "prints it ('SHA256:…', or that whole line), or the public key line ('ssh-ed25519 AAAA…'). "
        "Checked before any login; another key: 409 HOST_KEY_MISMATCH showing both fingerprints, "
        "nothing stored. Omitted: the key presented on this first contact is trusted and pinned.",
        examples=["SHA256:4bonP5uN3L61JTjrkYWeUnxgiSu27qxFLI5xg+VHDQc"],
    )

    @field_validator("ssh_host_key_fingerprint")
    @classmethod
    def _fingerprint(cls, value: str | None) -> str | None:
        return host_key_fingerprint(value) if value is not None and value.strip() else None

    # Issue 24 S5: a name that reaches a shell, a log line or an event has a grammar (422 naming it).
    @field_validator("ssh_username")
    @classmethod
    def _username(cls, value: str) -> str:
        return check_username(value)

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, value: str | None) -> str | None:
        return check_hostname(value) if value is not None else None


def _node_ip(value: str) -> str:
    try:
        return normalize_ip(value)
    except ValueError as exc:
        raise ValidationFailed(f"node_ip: {exc}", field="node_ip") from None


NODE_IP = Path(description="OS address of the node", max_length=IP_MAX, json_schema_extra=IP_SCHEMA)


@router.post(
    "/nodes",
    status_code=201,
    response_model=ComputeNode,
    summary="Adopt an installed compute node (SSH host key pinned on first contact)",
    description="The fabric worker connects once with the given credentials and pins the node's "
    "SSH host key (the one `ssh_host_key_fingerprint` names, if given; else the first one it sees); "
    "the answer carries its fingerprint. Unreachable or login refused: 502 naming "
    "the address and the cause, nothing stored. A key other than the pinned one: 409 "
    "HOST_KEY_CHANGED. Adopting an adopted node again replaces its credentials (same key only). "
    "While a fabric job (apply or teardown) runs: 409 FABRIC_JOB_RUNNING naming the job, nothing stored.",
    responses={
        **_COMMON,
        409: _err(
            "The node's host key differs from the pinned one (HOST_KEY_CHANGED) or from "
            "ssh_host_key_fingerprint (HOST_KEY_MISMATCH, both fingerprints shown), or a fabric job is "
            "running (FABRIC_JOB_RUNNING, names the job)"
        ),
        422: _err("Invalid field (named in `field`)"),
        502: _err("The node is unreachable or refused the login (NODE_UNREACHABLE, names address and cause)"),
    },
)
async def adopt_node(
    body: AdoptRequest, request: Request, _p: Principal = Depends(require(Role.operator))
) -> ComputeNode:
    rt = request.app.state.runtime
    box: SecretBox = request.app.state.secret_box
    ip = str(body.node_ip)
    problem = host_address_problem(ip, allow_loopback=rt.settings.adopt_allow_loopback)
    if problem:  # never a connection to 0.0.0.0, 127.0.0.1, 255.255.255.255, 224.0.0.1, fe80::1 …
        raise ValidationFailed(f"node_ip: {problem}", field="node_ip")
    if not (body.ssh_password or body.ssh_private_key):
        raise ValidationFailed(
            "ssh_password: give ssh_password or ssh_private_key (how Karios logs in)", field="ssh_password"
        )
    cmd = AdoptNode(
        node_ip=ip,
        ssh_port=body.ssh_port,
        os_username=body.ssh_username,
        os_password_enc=box.encrypt(body.ssh_password, context=password_context(ip))
        if body.ssh_password
        else None,
        ssh_private_key_enc=box.encrypt(body.ssh_private_key, context=private_key_context(ip))
        if body.ssh_private_key
        else None,
        hostname=body.hostname,
        bmc_ip=body.bmc_ip,
        connect_timeout=CONNECT_TIMEOUT,
        expected_host_key_fingerprint=body.ssh_host_key_fingerprint,
    )
    return await rt.bus.request(
        rt.bus.subjects.request("inventory", "adopt_node"),
        cmd,
        timeout=CONNECT_TIMEOUT + 10,
        reply=ComputeNode,
    )


@router.get(
    "/nodes",
    response_model=ComputeNodePage,
    summary="The fabric's compute nodes (adopted, first boot, or registered by BMC with an OS IP)",
    responses=_COMMON,
)
async def list_nodes(
    request: Request,
    offset: int = Query(0, ge=0, le=2_147_483_647, description="Items to skip"),
    limit: int = Query(100, ge=1, le=1000, description="Page size"),
    _p: Principal = Depends(require(Role.viewer)),
) -> Response:
    bus = request.app.state.runtime.bus
    # One inventory round trip serves every reader of this page for up to READ_TTL_S, encoded
    # once (api_gateway.readcache; a write through this gateway drops it at once).
    return await read_cache(request.app).response(
        nodes_page_key(offset, limit),
        lambda: bus.request(
            bus.subjects.query("inventory", "compute_nodes"),
            ComputeNodesQuery(offset=offset, limit=limit),
            reply=ComputeNodePage,
        ),
        request,
    )


@router.get(
    "/nodes/{node_ip}",
    response_model=ComputeNode,
    summary="One compute node",
    responses={**_COMMON, 404: _err("No compute node with this address"), 422: _err("node_ip is not an IP")},
)
async def get_node(
    request: Request, node_ip: str = NODE_IP, _p: Principal = Depends(require(Role.viewer))
) -> Response:
    bus, ip = request.app.state.runtime.bus, _node_ip(node_ip)
    # Shared like the list (api_gateway.readcache); a 404 is never kept.
    return await read_cache(request.app).response(
        node_key_of(ip),
        lambda: bus.request(
            bus.subjects.query("inventory", "compute_node"), ComputeNodeQuery(node_ip=ip), reply=ComputeNode
        ),
        request,
    )


@router.delete(
    "/nodes/{node_ip}",
    response_model=ComputeNode,
    summary="Remove a compute node from the fabric's node set",
    description="Refused (409 naming the node and its VTEP) while the node holds fabric state: tear "
    "it down first with DELETE /controlnode/fabric-config/node/{node_ip}. Otherwise the node "
    "leaves the set (a BMC registration keeps its record without the OS address) and its pinned "
    "host key is forgotten. Answers the removed node. While a fabric job (apply or teardown) runs: 409 "
    "FABRIC_JOB_RUNNING naming the job, nothing removed.",
    responses={
        **_COMMON,
        404: _err("No compute node with this address"),
        409: _err(
            "The node holds fabric state (VTEP allocated): tear it down first; or a fabric job is "
            "running (FABRIC_JOB_RUNNING, names the job)"
        ),
        422: _err("node_ip is not an IP"),
    },
)
async def remove_node(
    request: Request, node_ip: str = NODE_IP, _p: Principal = Depends(require(Role.operator))
) -> ComputeNode:
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.request("inventory", "remove_compute_node"),
        RemoveComputeNode(node_ip=_node_ip(node_ip)),
        reply=ComputeNode,
    )
