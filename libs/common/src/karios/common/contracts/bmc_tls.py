"""Contracts of the BMC TLS pins (trust on first use) the provisioner keeps.

The gateway's ``GET /controlnode/bmc-tls`` asks ``q.provision.tls_pins``; ``DELETE
/controlnode/bmc-tls/{bmc_ip}`` sends ``req.provision.clear_tls_pin``. See docs/provisioning.md
"BMC TLS".
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from karios.common.contracts.base import Query
from karios.common.limits import BoundedIP

FINGERPRINT_DOC = "SHA-256 of the BMC's leaf certificate (DER), upper-case hex pairs joined by ':'"


class TlsPinsQuery(Query):
    """The pinned BMC certificates, all or one BMC's."""

    TYPE = "karios.provision.tls_pins_query.v1"
    bmc_ip: BoundedIP | None = None


class ClearTlsPin(Query):
    """Forget a BMC's pinned certificate: its next contact pins what it presents then."""

    TYPE = "karios.provision.clear_tls_pin.v1"
    bmc_ip: BoundedIP


class TlsPin(BaseModel):
    bmc_ip: str = Field(description="BMC IP address")
    fingerprint: str = Field(description=FINGERPRINT_DOC)
    pinned_at: str = Field(description="When the certificate was first seen (ISO 8601)")


class TlsPinList(BaseModel):
    pins: list[TlsPin]


class TlsPinCleared(BaseModel):
    bmc_ip: str = Field(description="BMC IP address")
    fingerprint: str = Field(description=f"The pin that was removed: {FINGERPRINT_DOC}")
