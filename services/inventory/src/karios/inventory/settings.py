"""Inventory-only settings (``KARIOS_INVENTORY_`` prefix); shared ones live in KariosSettings."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class InventorySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KARIOS_INVENTORY_", extra="ignore")

    disk_role: str = Field("disk", description="Inventory-item role slug that marks a disk.")
    gpu_role: str = Field("gpu", description="Inventory-item role slug that marks a GPU.")
    disk_module_profile: str = Field("Hard disk", description="Module type profile that marks a disk module.")
    gpu_module_profile: str = Field("GPU", description="Module type profile that marks a GPU module.")
    pxe_field: str = Field("pxe_enabled", description="Boolean custom field on dcim.device.")
    cache_ttl: float = Field(60.0, description="Seconds a found host stays cached.")
    negative_ttl: float = Field(5.0, description="Seconds an unknown MAC/name stays cached as unknown.")
    cache_size: int = Field(10_000, ge=1, description="Most entries kept in the lookup cache.")
    netbox_timeout: float = Field(10.0, description="Seconds per NetBox HTTP call.")
    webhook_secret: SecretStr | None = Field(
        None, description="Secret of the NetBox webhook; without it the receiver refuses everything."
    )
    changelog_interval: float = Field(
        3.0,
        ge=0,
        description="Seconds between polls of NetBox's change log (one replica polls; 0 = off).",
    )
    static_pool: str = Field("", description="CIDR static IPv4s are allocated from (file inventory).")
    static_pool_start: str = Field("", description="First address to hand out (default: network + 10).")
    static_gateway: str = Field("", description="Gateway returned with each allocation.")
    writeback: bool = Field(
        False,
        description="Write what Karios reads of a server back to NetBox: after each inspection its "
        "interfaces and MACs, disk and GPU inventory items and a journal entry; at the adoption of a "
        "discovered server its device (status planned). NetBox only; the token needs write permission.",
    )
    writeback_site: str = Field(
        "", description="Site slug of the NetBox devices adoption creates (without it none is created)."
    )
    writeback_role: str = Field(
        "",
        description="Device role slug of the NetBox devices adoption creates (without it none is created).",
    )
    writeback_device_type: str = Field(
        "",
        description="Device type slug of every device adoption creates; empty: the type of the server's "
        "DMI make and model, found in NetBox or created (with its manufacturer).",
    )
