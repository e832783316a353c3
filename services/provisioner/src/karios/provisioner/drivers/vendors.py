"""Vendor drivers: each overrides only what its firmware does differently (see quirks.QUIRKS)."""

from __future__ import annotations

from typing import Any

from karios.provisioner.drivers.quirks import Quirks
from karios.provisioner.drivers.redfish import RedfishDriver


class DellIdrac(RedfishDriver):
    vendor = "dell"
    quirks = Quirks(
        vm_prefer="system",
        retry_on_409=True,
        firmware_skip_prefixes=("Current-", "Previous-", "Available-", "Installable-"),
    )


class HpeIlo(RedfishDriver):
    vendor = "hpe"
    quirks = Quirks(vm_prefer="manager", retry_on_409=True, pci_ids_decimal=True)

    @staticmethod
    def _oem_target(slot: dict[str, Any], name: str) -> str:
        acts = ((slot.get("Oem") or {}).get("Hpe") or {}).get("Actions") or {}
        return (acts.get(f"#HpeiLOVirtualMedia.{name}") or {}).get("target", "")

    async def insert(self, slot_uri: str, slot: dict[str, Any], image: str) -> None:
        if not self.action_target(slot, "InsertMedia") and self._oem_target(slot, "InsertVirtualMedia"):
            await self.request("POST", self._oem_target(slot, "InsertVirtualMedia"), {"Image": image})
            return
        await super().insert(slot_uri, slot, image)

    async def eject(self, slot_uri: str, slot: dict[str, Any]) -> None:
        if (
            self.inserted(slot)
            and not self.action_target(slot, "EjectMedia")
            and self._oem_target(slot, "EjectVirtualMedia")
        ):
            await self.request("POST", self._oem_target(slot, "EjectVirtualMedia"), {})
            return
        await super().eject(slot_uri, slot)


class LenovoXcc(RedfishDriver):
    vendor = "lenovo"
    quirks = Quirks(
        vm_prefer="manager",
        boot_enabled="Once",
        host_interface_nics=frozenset({"ToManager"}),
        firmware_push="multipart",
    )

    def is_cd_slot(self, slot: dict[str, Any]) -> bool:
        # XCC slots all list CD; "EXT" slots take a URI (Remote*/RDOC* are for uploads).
        return super().is_cd_slot(slot) and str(slot.get("Id", "")).startswith("EXT")


class SupermicroBmc(RedfishDriver):
    vendor = "supermicro"
    quirks = Quirks(
        vm_prefer="manager", eject_when_empty_errors=True, gpu_ids_from_oem=True, bios_names_suffixed=True
    )

    async def eject(self, slot_uri: str, slot: dict[str, Any]) -> None:
        if not self.action_target(slot, "EjectMedia") and self.inserted(slot):
            await self.request("PATCH", slot_uri, {"Image": None, "Inserted": False})
            return
        await super().eject(slot_uri, slot)


class CiscoCimc(RedfishDriver):
    vendor = "cisco"
    quirks = Quirks(
        vm_prefer="manager", insert_omit=frozenset({"Inserted", "WriteProtected"}), retry_on_409=True
    )
