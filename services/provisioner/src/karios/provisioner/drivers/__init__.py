"""BMC drivers: generic Redfish plus vendor modules that override only what differs."""

from __future__ import annotations

from karios.common.errors import ValidationFailed
from karios.provisioner.drivers.quirks import QUIRKS, Quirks
from karios.provisioner.drivers.redfish import BmcEndpoint, RedfishDriver
from karios.provisioner.drivers.vendors import CiscoCimc, DellIdrac, HpeIlo, LenovoXcc, SupermicroBmc

DRIVERS: dict[str, type[RedfishDriver]] = {
    "generic": RedfishDriver,
    "dell": DellIdrac,
    "hp": HpeIlo,
    "hpe": HpeIlo,
    "lenovo": LenovoXcc,
    "supermicro": SupermicroBmc,
    "cisco": CiscoCimc,
}


def driver_for(vendor: str) -> type[RedfishDriver]:
    cls = DRIVERS.get((vendor or "generic").strip().lower())
    if cls is None:
        raise ValidationFailed(
            f"vendor: {vendor!r} is not one of {', '.join(sorted(DRIVERS))}", field="vendor"
        )
    return cls


__all__ = ["DRIVERS", "QUIRKS", "BmcEndpoint", "Quirks", "RedfishDriver", "driver_for"]
