"""Compute nodes of the fabric: adoption of an installed node, first-boot auto-registration,
listing and removal (owned by the inventory; host keys pinned by the fabric worker).

Credentials travel only as SecretBox ciphertext with the contexts below; the fabric worker
decrypts them right before it connects. No event or reply carries them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from karios.common.contracts.base import Command, Event, Query
from karios.common.limits import BoundedIP, Ciphertext, HostName, Name, OptBoundedIP

NodeSource = Literal["adopted", "firstboot", "registry"]
SSH_PORT = Field(22, ge=1, le=65535, description="SSH port of the node")
FINGERPRINT_PATTERN = r"^SHA256:[A-Za-z0-9+/]{43}$"
_FINGERPRINT = re.compile(r"^SHA256:([A-Za-z0-9+/]{43})=?$")


def _key_type(blob: bytes) -> str:
    """The key type a public key blob starts with (``ssh-ed25519``…), '' if it is not one."""
    n = int.from_bytes(blob[:4], "big")
    return blob[4 : 4 + n].decode("ascii", "replace") if 0 < n <= 64 and len(blob) > 4 + n else ""


def host_key_fingerprint(value: str) -> str:
    """``SHA256:<base64>`` (as ``ssh-keygen -lf`` prints it) of an expected SSH host key given as
    that fingerprint, the whole ``ssh-keygen -lf`` line (``256 SHA256:… root@n1 (ED25519)``) or a
    public key line (``ssh-ed25519 AAAA… [comment]``, also a known_hosts line). ValueError else."""
    tokens = value.split()
    for token in tokens:
        if token.upper().startswith(("SHA256:", "MD5:")):
            m = _FINGERPRINT.match(token)
            if m is None:
                raise ValueError(f"{token[:60]!r} is not a SHA256 fingerprint (ssh-keygen -lf -E sha256)")
            return f"SHA256:{m.group(1)}"
    for kind, text in itertools.pairwise(tokens):
        try:
            blob = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            continue
        if _key_type(blob) == kind:
            return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    raise ValueError(
        "expected 'SHA256:…' as `ssh-keygen -lf` prints it, or a public key line 'ssh-ed25519 AAAA…'"
    )


def password_context(node_ip: str) -> str:
    """SecretBox context of a compute node's SSH password."""
    return f"node:{node_ip}"


def private_key_context(node_ip: str) -> str:
    """SecretBox context of a compute node's SSH private key."""
    return f"node-key:{node_ip}"


class NodeCredentials(BaseModel):
    """How to log in over SSH (ciphertexts only, contexts :func:`password_context` /
    :func:`private_key_context` of ``node_ip``)."""

    node_ip: BoundedIP
    ssh_port: int = SSH_PORT
    os_username: Name = "root"
    os_password_enc: Ciphertext | None = None
    ssh_private_key_enc: Ciphertext | None = None


EXPECTED_KEY = Field(
    None,
    pattern=FINGERPRINT_PATTERN,
    description="The host key the node must present (SHA256 fingerprint, see host_key_fingerprint); "
    "None = trust on first use. Another key: 409 HOST_KEY_MISMATCH, no login attempted.",
)


class AdoptNode(NodeCredentials, Command):
    """Register an already-installed node: the fabric worker connects once and pins its host key
    (nothing is stored when it cannot); re-adopting updates the credentials, never the pin."""

    TYPE = "karios.inventory.adopt_node.v1"

    hostname: HostName | None = None
    bmc_ip: OptBoundedIP = None
    connect_timeout: float = Field(10.0, gt=0, le=60)
    expected_host_key_fingerprint: str | None = EXPECTED_KEY


class RegisterComputeNode(NodeCredentials, Command):
    """A node Karios provisioned reported its first boot: record it (idempotent per node_ip; an
    earlier row of the same BMC under another address is replaced). Host key: first contact."""

    TYPE = "karios.inventory.register_compute_node.v1"

    hostname: HostName | None = None
    bmc_ip: OptBoundedIP = None


class ComputeNode(BaseModel):
    """A node of the fabric's node set, as any caller may see it (no secrets)."""

    node_ip: str
    hostname: str = ""
    bmc_ip: str = ""
    ssh_port: int = 22
    os_username: str = "root"
    auth: Literal["password", "ssh_key", "password+ssh_key", "worker_key"] = Field(
        "worker_key",
        description="How the fabric worker logs in: the stored password and/or private key, "
        "or (neither stored) the worker's own key KARIOS_FABRIC_SSH_KEY",
    )
    source: NodeSource = Field(
        "adopted",
        description="adopted (POST /controlnode/nodes), firstboot (provisioned by Karios) or "
        "registry (a node registered by BMC through /controlnode/register with an os_ip)",
    )
    host_key_fingerprint: str = Field("", description="SHA256 fingerprint pinned at adoption ('' = not yet)")
    created_at: datetime | None = None
    updated_at: datetime | None = None


class ComputeNodesQuery(Query):
    TYPE = "karios.inventory.compute_nodes_query.v1"
    offset: int = Field(0, ge=0)
    limit: int = Field(100, ge=1, le=1000)


class ComputeNodePage(BaseModel):
    items: list[ComputeNode]
    total: int
    offset: int
    limit: int


class ComputeNodeQuery(Query):
    TYPE = "karios.inventory.compute_node_query.v1"
    node_ip: BoundedIP


class RemoveComputeNode(Command):
    """Take a node out of the fabric's node set (refused while it holds fabric state or a
    fabric job runs)."""

    TYPE = "karios.inventory.remove_compute_node.v1"
    node_ip: BoundedIP


class ComputeNodeChanged(Event):
    """A node joined (adopted / firstboot) or left the node set. Never carries credentials."""

    TYPE = "karios.inventory.compute_node_changed.v1"
    node_ip: str
    change: Literal["adopted", "registered", "removed"]
    hostname: str = ""
    bmc_ip: str = ""
    host_key_fingerprint: str = ""


# -- asked of the fabric worker (it owns SSH and the host-key pin store) -------------------------


class PinNodeHostKey(NodeCredentials, Query):
    """Connect once with these credentials, check the host key against the pin store (a changed
    key is refused: 409 HOST_KEY_CHANGED), pin a first-seen one. Unreachable: 502 naming it.
    While a fabric job runs: 409 FABRIC_JOB_RUNNING naming it (no contact; adopt nothing)."""

    TYPE = "karios.fabric.pin_host_key.v1"
    connect_timeout: float = Field(10.0, gt=0, le=60)
    # The key the inventory already holds for this address (an earlier adoption), if any: checked
    # like the pin store's, so a lost pin store does not turn a changed key into a first contact.
    known_host_key: str | None = None
    # The operator's expected key (adoption with ssh_host_key_fingerprint): the node must present
    # it before any login is tried; otherwise 409 HOST_KEY_MISMATCH naming the field.
    expected_host_key_fingerprint: str | None = EXPECTED_KEY


class PinnedHostKey(BaseModel):
    node_ip: str
    host_key: str  # "ssh-ed25519 AAAA..." (public)
    fingerprint: str  # "SHA256:..."
    first_seen: bool


class ReleaseFabricNode(Query):
    """The node leaves the node set: 409 while it holds fabric state (a VTEP allocation: tear
    it down first) or while a fabric job runs (FABRIC_JOB_RUNNING naming it; not for
    ``reinstalled``); otherwise its pinned host key is forgotten."""

    TYPE = "karios.fabric.release_node.v1"
    node_ip: BoundedIP
    # First boot of a fresh install (proved by its job token): only forget the old pinned key,
    # whatever fabric state the address holds; the next contact pins the new one.
    reinstalled: bool = False


class ReleasedFabricNode(BaseModel):
    node_ip: str
    host_key_forgotten: bool
