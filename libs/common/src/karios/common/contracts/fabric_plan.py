"""Contracts of the fabric planner: ``POST /controlnode/fabric-config/plan`` (a dry run that
writes nothing) and the plan it answers. Re-exported by :mod:`karios.common.contracts.fabric`.

Field names are the seed's (``../shared/seeds/000_*.txt``); the request also takes the names
of ``POST /controlnode/fabric-config`` (``as``, ``ospf_enabled``), so one form serves both.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from karios.common.contracts.base import Query
from karios.common.devicetext import DeviceTextRules


class FabricPlanRequest(DeviceTextRules, Query):
    """``POST /controlnode/fabric-config/plan`` body: the seed's fields (``local_as``,
    ``underlay_mode``), the same names as ``POST /controlnode/fabric-config`` (``as``,
    ``ospf_enabled``, ``router_id_cidr``, ...), and optional rendering inputs. The names of
    /fabric-config a dry run has no use for (read-only echoes, ack-gate fields, ``clear_*``) are
    accepted and ignored, as /fabric-config ignores its read-only ones; a ``bgp_password`` only
    means ``bgp_password_set`` (secrets are never forwarded). Any other field is a 422 naming
    it: a misspelt field must not silently plan something else."""

    TYPE = "karios.fabric.plan.v1"
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # `as` before `local_as` and `ospf_enabled` before `underlay_mode`: their validators compare.
    as_: int = Field(0, alias="as", description="BGP AS of the nodes, as in /fabric-config; 0 => auto-pick")
    advertise_all_vni: bool = Field(True, description="As in /fabric-config")
    expected_nodes: int = Field(0, description="Sizing hint; unset = default /24 pool")
    expected_vms: int = Field(0, description="Sizing hint for tenant subnets (notes only)")
    fabric_switch_as: int = Field(0, description="0 => planner suggests")
    fabric_switch_name: str = Field("", description="Hostname (RFC 1123 label, <= 63 characters)")
    fabric_switch_nos: str = Field("", description="sonic|cumulus|nxos|eos|other (required)")
    fabric_switch_peering_ip: str = Field("", description="empty => planner suggests")
    fabric_switch_role: str = Field("", description="spine|leaf|border-leaf")
    local_as: int = Field(0, description="The seed's name of `as` (0 => auto-pick); both sent must agree")
    management_cidr: str = Field("", description='e.g. "192.168.111.0/24" (required)')
    ospf_enabled: bool | None = Field(
        None, description="As in /fabric-config: false = BGP underlay; null = from underlay_mode"
    )
    public_mtu: int = Field(0, description="VR public-side MTU: required in DC mode")
    router_id_base: str = Field("", description="empty => 10.255.0.0")
    router_id_prefix_len: int = Field(0, description="0 => auto-size; operator value honoured verbatim")
    router_id_cidr: str = Field(
        "", description='"A.B.C.D/N" instead of router_id_base + router_id_prefix_len (as in /fabric-config)'
    )
    underlay_mode: str = Field(
        "", description='"" / "ospf" (default) | "bgp"; must agree with ospf_enabled when both are sent'
    )
    vxlan_mtu: int = Field(0, description="Fabric/data-plane MTU (required)")
    # Optional extras that change the rendered switch configuration.
    deployment_mode: str = Field("", description='"" (auto) | "cube" | "dc"')
    external_route_reflector: bool = Field(False, description="Route reflector on the switch")
    bfd_enabled: bool = False
    ospf_area: str = Field("", max_length=15)
    ospf_auth_type: str = ""
    ospf_auth_key_id: int = 0
    ospf_auto_ref_bw: int = Field(0, description="OSPF auto-cost reference bandwidth, Mbit/s (0 = default)")
    ospf_fabric_interface: str = Field("", description="Linux interface name (<= 15 characters)")
    ospf_hello_interval: int = 0
    ospf_dead_interval: int = 0
    bgp_password_set: bool = Field(False, description="Render BGP authentication (placeholder secret)")

    #: Names of POST /fabric-config accepted here and ignored: set by ``contracts.fabric`` (every
    #: ``FabricConfigInput`` name this model has no field for), so the two cannot drift apart.
    CONFIG_ONLY: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _drop_config_only(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        kept = {k: v for k, v in data.items() if k not in cls.CONFIG_ONLY}
        if data.get("bgp_password") and "bgp_password_set" not in data:
            kept["bgp_password_set"] = True  # the plan renders a placeholder; the secret goes no further
        return kept

    @field_validator("local_as")
    @classmethod
    def _same_as(cls, value: int, info: ValidationInfo) -> int:
        other = info.data.get("as_", 0)
        if value and other and value != other:
            raise ValueError(f"{value} disagrees with as {other} (local_as is the seed's name of as)")
        return value

    @field_validator("underlay_mode")
    @classmethod
    def _same_underlay(cls, value: str, info: ValidationInfo) -> str:
        ospf = info.data.get("ospf_enabled")
        mode = value.strip().lower()
        if ospf is not None and mode in ("ospf", "bgp") and (mode == "ospf") != ospf:
            raise ValueError(f"{mode} disagrees with ospf_enabled {str(ospf).lower()}")
        return value

    @property
    def node_as(self) -> int:
        """The nodes' AS, whichever name carried it (0: auto-pick)."""
        return self.as_ or self.local_as

    @property
    def node_as_field(self) -> str:
        return "as" if self.as_ else "local_as"

    @property
    def underlay(self) -> str:
        """``underlay_mode`` as sent (normalised), else from ``ospf_enabled``; "" = default."""
        mode = self.underlay_mode.strip().lower()
        if not mode and self.ospf_enabled is not None:
            return "ospf" if self.ospf_enabled else "bgp"
        return mode


class PlannedConfig(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    advertise_all_vni: bool = True
    as_: int = Field(0, alias="as")
    bfd_enabled: bool = False
    bgp_password: str = Field("", description="Never echoed: always empty")
    expected_nodes: int = 0
    expected_vms: int = 0
    external_route_reflector: bool = False
    fabric_switch_as: int = 0
    fabric_switch_name: str = ""
    fabric_switch_nos: str = ""
    fabric_switch_peering_ip: str = ""
    fabric_switch_role: str = ""
    management_cidr: str = ""
    ospf_area: str = ""
    ospf_auth_type: str = ""
    ospf_auth_key_id: int = 0
    ospf_auto_ref_bw: int = 0
    ospf_dead_interval: int = 0
    ospf_enabled: bool = True
    ospf_fabric_interface: str = ""
    ospf_hello_interval: int = 0
    public_mtu: int = 0
    rollout_status: str = ""
    router_id_base: str = ""
    router_id_prefix_len: int = 0
    vxlan_mtu: int = 0


class FabricPlan(BaseModel):
    config: PlannedConfig
    bgp_mode: str
    underlay_mode: str
    deployment_mode: str
    vtep_capacity: int
    vni_start: int
    vni_end: int
    risks: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    switch_config: str = ""
    plan_hash: str = ""
