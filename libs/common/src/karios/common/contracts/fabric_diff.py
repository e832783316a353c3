"""Contracts of the fabric apply preview (issue 15 item 2): what an apply would change on each
node, computed read-only (load → discover → render → diff, stopped before the commit).

``POST /controlnode/fabric-config/diff`` answers :class:`FabricDiffView`; the bus query is
``q.fabric.diff`` (:class:`FabricDiffQuery`). No secret is ever part of a diff: the file diffs are
made from copies in which every BGP password / OSPF key (the intent's and whatever the node's
files hold) reads ``<redacted>``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from karios.common.contracts.base import Query

REDACTED = "<redacted>"


class FabricDiffQuery(Query):
    """Preview an apply: every registered node, or only ``node_ip``."""

    TYPE = "karios.fabric.diff_query.v1"
    node_ip: str = Field("", description="Only this node (its OS IP); empty = every registered node")


class FileDiff(BaseModel):
    """One managed FRR file (``/etc/frr/<name>``) the apply would write or delete."""

    name: Literal["daemons", "frr.conf", "vtysh.conf"]
    change: Literal["create", "modify", "delete"]
    diff: str = Field(
        "",
        description="unified diff (a/ = on the node, b/ = what the apply writes), secrets redacted; "
        "a change of secret values alone reads '# only secret values differ (not shown)'",
    )


class LinkChange(BaseModel):
    """One kernel change on a device the rollout owns (vtep0, vxlanN, brN)."""

    device: str = Field(description="vtep0, vxlan<VNI> or br<VNI>")
    action: Literal["create", "delete", "address", "flush", "mtu", "master", "up"]
    detail: str = Field("", description="e.g. '198.19.1.1/32', 'mtu 9000 → 8950', 'in br100'")
    command: str = Field("", description="the `ip` command the apply runs")


class NodeDiff(BaseModel):
    """What an apply would change on one node. ``changed`` false = the apply leaves it alone."""

    node_ip: str
    fqdn: str = ""
    reachable: bool = True
    error: str = Field("", description="why no diff could be made (unreachable, no underlay …)")
    changed: bool = False
    vtep_ip: str = Field("", description="the node's VTEP address (allocated, or the one apply would)")
    vtep_allocated: bool = Field(False, description="false: apply allocates vtep_ip from the pool")
    frr_install: bool = Field(False, description="FRR is not installed: apply installs it first")
    frr_action: Literal["none", "start", "reload", "restart", "stop"] = "none"
    files: list[FileDiff] = Field(default_factory=list, description="changed files only")
    links: list[LinkChange] = Field(default_factory=list)


class FabricDiffView(BaseModel):
    """``POST /controlnode/fabric-config/diff``: the per-node preview of an apply."""

    changed: bool = Field(False, description="some node would change")
    nodes_total: int = 0
    nodes_changed: int = 0
    nodes_failed: int = Field(0, description="nodes with an error (no diff could be made)")
    nodes_unreachable: int = 0
    nodes: list[NodeDiff] = Field(default_factory=list)
