"""The switch re-configuration ack gate (pure).

Any change of the fabric config that changes the configuration Karios renders for the fabric
switch (:func:`render.render_switch_config` of the stored config vs of the merged one, for the
NOS being acknowledged; comment lines do not count) needs the switch changed first: the first
POST answers 409 ``REQUIRES_SWITCH_RECONFIG_ACK`` with, per NOS, the snippet that turns the
running configuration into the new one (:mod:`switchdiff`), the diff, a verify command and a
sha256 over NOS, both configurations and the snippet; ``changed_fields`` names the fields that
moved it. The operator applies it, checks it, and re-POSTs with ``switch_acked``, that hash and
``acked_by``. A hash for an older or different change no longer matches. ``skip_switch_ack``
bypasses the gate for ``fabric_admin`` callers only (labs, CI). Every accepted change is audited.

Secrets are placeholders in the rendered text, so their changes are given to the gate as a
:class:`SecretChange`: a BGP password set or cleared changes the rendering (the ``password``
line comes or goes); a BGP password or OSPF key whose *value* changes leaves the text as it was,
yet the switch must be told the new value — the old placeholder is renamed (``<old-…>``) so the
snippet re-enters that line and the change is gated like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from karios.common.contracts.fabric import FabricConfigFields, FabricConfigInput, SwitchReconfigAckRequired
from karios.common.errors import ValidationFailed
from karios.fabric_worker.config import switchdiff
from karios.fabric_worker.config.render import (
    SWITCH_NOS,
    FabricLike,
    render_for_nos,
    switch_context,
    switch_snippet,
)

ADMIN_ROLE = "fabric_admin"


SECRET_PLACEHOLDERS = {"bgp_password": "<bgp-password>", "ospf_auth_key": "<ospf-auth-key>"}


@dataclass(frozen=True)
class SecretChange:
    """The switch-relevant secrets before and after the write (never their values)."""

    bgp_password_before: bool = False
    bgp_password_after: bool = False
    value_changed: tuple[str, ...] = ()  # of SECRET_PLACEHOLDERS: a new value for a set secret

    def fields(self) -> list[str]:
        """The API fields of the secret changes that move the switch configuration."""
        out = ["bgp_password"] if self.bgp_password_before != self.bgp_password_after else []
        return out + [f for f in self.value_changed if f not in out]


def _with_old_values(text: str, changed: tuple[str, ...]) -> str:
    """The running text with the placeholders of re-valued secrets renamed: their lines differ."""
    for name in changed:
        placeholder = SECRET_PLACEHOLDERS[name]
        text = text.replace(placeholder, "<old-" + placeholder[1:])
    return text


@dataclass(frozen=True)
class AckRecord:
    """One line of the audit log: who changed the switch, acknowledging which snippet (the
    listen ranges before and after; equal or empty when the change is elsewhere)."""

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


# The fields the switch configuration is rendered from, in the contract's order (API names).
SWITCH_FIELDS = tuple(f for f in FabricConfigFields.model_fields if f in FabricLike.__annotations__)


def _api_name(attr: str) -> str:
    return FabricConfigFields.model_fields[attr].alias or attr


def _config(cfg: FabricConfigFields, nos: str) -> list[str]:
    return switchdiff.config_lines(nos, render_for_nos(cfg, nos))


def changed_fields(stored: FabricConfigFields, merged: FabricConfigFields, nos: str) -> list[str]:
    """The fields whose change alone changes the switch configuration for `nos` (all fields
    that differ when only their combination does)."""
    differ = [f for f in SWITCH_FIELDS if getattr(stored, f) != getattr(merged, f)]
    before = _config(stored, nos)
    moved = []
    for f in differ:
        try:
            alone = _config(stored.model_copy(update={f: getattr(merged, f)}), nos)
        except (ValueError, KeyError):
            alone = []  # the field is not valid on its own: it takes part in the change
        if alone != before:
            moved.append(f)
    return [_api_name(f) for f in moved or differ]


def _message(stored: FabricConfigFields, merged: FabricConfigFields, nos: str, fields: list[str]) -> str:
    old, new = listen_range(stored), listen_range(merged)
    what = f"the switch configuration ({nos}) changes with {', '.join(fields)}"
    if old != new and old and new:
        subnet = "VTEP pool" if merged.ospf_enabled else "management subnet"
        what += f"; its BGP listen range (the {subnet}) moves from {old} to {new}"
    elif old != new:
        what += f"; the switch {'stops' if old else 'starts'} running BGP (listen range {old or new})"
    return what


def evaluate(
    stored: FabricConfigFields | None,
    merged: FabricConfigFields,
    inp: FabricConfigInput,
    *,
    caller: str,
    caller_role: str,
    secrets: SecretChange | None = None,
) -> AckRecord | None:
    """None: no gate applies. An :class:`AckRecord`: the change is acknowledged. Raises 409 otherwise."""
    secrets = secrets or SecretChange()
    if stored is None or not stored.router_id_base or not stored.router_id_prefix_len:
        return None  # nothing rendered for the switch yet (first or incomplete legacy config)
    ack_nos = (inp.switch_nos or merged.fabric_switch_nos or "other").strip().lower()
    if ack_nos not in SWITCH_NOS:
        raise ValidationFailed(
            f"switch_nos: {ack_nos!r} is not one of {', '.join(SWITCH_NOS)}", field="switch_nos"
        )
    try:
        running = {
            nos: _with_old_values(
                render_for_nos(stored, nos, bgp_password_set=secrets.bgp_password_before),
                secrets.value_changed,
            )
            for nos in SWITCH_NOS
        }
    except ValidationFailed:
        return None  # a row stored before a rendering rule: never rendered, nothing to compare
    texts = {
        nos: (running[nos], render_for_nos(merged, nos, bgp_password_set=secrets.bgp_password_after))
        for nos in SWITCH_NOS
    }
    before, after = texts[ack_nos]
    if switchdiff.config_lines(ack_nos, before) == switchdiff.config_lines(ack_nos, after):
        return None  # nothing on the switch changes
    snippets = {nos: switch_snippet(nos, *texts[nos]) for nos in SWITCH_NOS}
    fields = changed_fields(stored, merged, ack_nos) + secrets.fields()
    old, new = listen_range(stored), listen_range(merged)
    expected = snippets[ack_nos]["switch_snippet_hash"]
    details = {
        "old_listen_range": old,
        "new_listen_range": new,
        "changed_fields": fields,
        "switch_nos": ack_nos,
        "switch_snippet_hash": expected,
        "snippets": [snippets[n] for n in SWITCH_NOS],
    }
    if inp.skip_switch_ack and caller_role == ADMIN_ROLE:
        return AckRecord(inp.acked_by or caller, caller, caller_role, ack_nos, "", old, new, skipped=True)
    what = _message(stored, merged, ack_nos, fields)
    if inp.switch_acked:
        if inp.switch_snippet_hash.strip().lower() != expected:
            raise SwitchReconfigAckRequired(
                f"switch_snippet_hash does not match this change on {ack_nos} (wrong or stale; "
                f"{what}): apply the snippet below and echo its hash",
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
    raise SwitchReconfigAckRequired(
        f"{what}: change the fabric switch first (snippet below), then re-POST with "
        f"switch_acked, switch_snippet_hash and acked_by{why}",
        field=fields[0],
        details=details,
    )
