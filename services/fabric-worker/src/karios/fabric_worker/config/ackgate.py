"""The switch re-configuration ack gate (pure).

A change that moves the BGP listen range of the fabric switch's configuration (the same
:func:`switch_context` renders it) needs the switch changed first: the VTEP pool with an OSPF
underlay, the management subnet with a BGP underlay, and nothing at all when the switch runs
no BGP (the route reflector is the gateway node). Before such a change is stored the operator
must change the switch: the first POST answers 409
``REQUIRES_SWITCH_RECONFIG_ACK`` with a per-NOS snippet and its sha256; the operator applies
it, checks it, and re-POSTs with ``switch_acked``, that hash and ``acked_by``. A hash for an
older or different change no longer matches. ``skip_switch_ack`` bypasses the gate for
``fabric_admin`` callers only (labs, CI). Every accepted move is audited.
"""

from __future__ import annotations

from dataclasses import dataclass

from karios.common.contracts.fabric import FabricConfigFields, FabricConfigInput, SwitchReconfigAckRequired
from karios.common.errors import ValidationFailed
from karios.fabric_worker.config.render import SWITCH_NOS, listen_range_snippet, switch_context

ADMIN_ROLE = "fabric_admin"


@dataclass(frozen=True)
class AckRecord:
    """One line of the audit log: who moved the pool, acknowledging which snippet."""

    acked_by: str
    caller: str
    caller_role: str
    switch_nos: str
    switch_snippet_hash: str
    old_range: str
    new_range: str
    skipped: bool


def listen_range(cfg: FabricConfigFields) -> str:
    """The BGP listen range the switch configuration of `cfg` holds ("" when the switch runs no
    BGP: the route reflector is the gateway node). Taken from the same :class:`SwitchContext`
    that renders the switch configuration: the VTEP pool with an OSPF underlay (sessions come
    from the loopbacks), the management subnet with a BGP underlay."""
    if not cfg.router_id_base or not cfg.router_id_prefix_len:
        return ""
    ctx = switch_context(cfg)
    return ctx.listen_range if ctx.switch_bgp else ""


def _moved_field(stored: FabricConfigFields, merged: FabricConfigFields) -> str:
    if merged.ospf_enabled:
        return "router_id_base"
    return "management_cidr" if stored.management_cidr != merged.management_cidr else "ospf_enabled"


def evaluate(
    stored: FabricConfigFields | None,
    merged: FabricConfigFields,
    inp: FabricConfigInput,
    *,
    caller: str,
    caller_role: str,
) -> AckRecord | None:
    """None: no gate applies. An :class:`AckRecord`: the move is acknowledged. Raises 409 otherwise."""
    if stored is None:
        return None
    old, new = listen_range(stored), listen_range(merged)
    if not old or not new or old == new:
        return None  # nothing on the switch changes (or there is no listen range to move)
    asn = stored.fabric_switch_as or stored.as_  # the `router bgp` the switch runs now
    snippets = {
        nos: listen_range_snippet(nos, asn=asn, node_as=merged.as_, old_range=old, new_range=new)
        for nos in SWITCH_NOS
    }
    ack_nos = (inp.switch_nos or merged.fabric_switch_nos or "other").strip().lower()
    if ack_nos not in snippets:
        raise ValidationFailed(
            f"switch_nos: {ack_nos!r} is not one of {', '.join(SWITCH_NOS)}", field="switch_nos"
        )
    expected = snippets[ack_nos]["switch_snippet_hash"]
    details = {
        "old_listen_range": old,
        "new_listen_range": new,
        "switch_nos": ack_nos,
        "switch_snippet_hash": expected,
        "snippets": [snippets[n] for n in SWITCH_NOS],
    }
    if inp.skip_switch_ack and caller_role == ADMIN_ROLE:
        return AckRecord(inp.acked_by or caller, caller, caller_role, ack_nos, "", old, new, skipped=True)
    if inp.switch_acked:
        if inp.switch_snippet_hash.strip().lower() != expected:
            raise SwitchReconfigAckRequired(
                f"switch_snippet_hash does not match the change {old} -> {new} on {ack_nos} "
                "(wrong or stale): apply the snippet below and echo its hash",
                field="switch_snippet_hash",
                details=details,
            )
        if not inp.acked_by.strip():
            raise ValidationFailed("acked_by: required with switch_acked (audit log)", field="acked_by")
        return AckRecord(
            inp.acked_by.strip(), caller, caller_role, ack_nos, expected, old, new, skipped=False
        )
    why = ""
    if inp.skip_switch_ack:
        why = f" (skip_switch_ack needs role {ADMIN_ROLE}; caller has {caller_role})"
    what = "VTEP pool" if merged.ospf_enabled else "management subnet"
    raise SwitchReconfigAckRequired(
        f"the switch's BGP listen range (the {what}) moves from {old} to {new}: change it on the "
        f"fabric switch, then re-POST with switch_acked, switch_snippet_hash and acked_by{why}",
        field=_moved_field(stored, merged),
        details=details,
    )
