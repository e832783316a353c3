"""The grammar of free text that lands in a switch or node configuration (pure, no I/O).

A value rendered into NOS CLI, NVUE commands, a SONiC patch or ``frr.conf`` must be one token of
that syntax: a newline (or CR, NUL, U+2028) would start a line of live configuration, a leading
``!``/``#`` a comment, a space a second argument. So each field has a grammar with no such
character, and a length limit.

Each ``*_problem`` function answers ``None`` or why the value is refused, without echoing it
(secrets pass here too, and a 100 KB value is no message). The API models turn that into a 422
naming the field (``check_*``: ``ValueError`` for pydantic validators) and the stored-config
rules into a violation naming the field, so both say the same thing.
"""

from __future__ import annotations

import re
import unicodedata

from pydantic import BaseModel, ValidationInfo, field_validator

from karios.common.errors import ValidationFailed

# A switch name is rendered as a hostname (NVUE ``nv set system hostname``) and in comments.
# The one grammar every target takes as a hostname is the RFC 952/1123 host *label*: ASCII
# letters, digits and inner hyphens, starting with a letter, at most 63 characters. That is
# what IOS-style CLIs (EOS, NX-OS) document for ``hostname``; NVUE refuses underscores in a
# hostname; SONiC's DEVICE_METADATA hostname and FRR's ``hostname WORD`` accept it. Dots are
# left out (an FQDN is a hostname plus the separate domain-name setting on the CLI NOSes), and
# so is everything that means something to a parser: whitespace, ``!``, ``#``, quotes, ``;``.
SWITCH_NAME_MAX = 63
SWITCH_NAME = re.compile(r"[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

# Linux interface names: ``dev_valid_name`` allows up to IFNAMSIZ - 1 = 15 bytes of anything but
# '/', ':', whitespace and NUL (and not "." or ".."). Narrowed to what ip(8), FRR and NVUE read
# unquoted: ASCII letters, digits, '_', '.', '-', starting with a letter or digit (so the
# name can never read as an option, ``-x``, or a comment, ``!x``/``#x``).
IFNAME_MAX = 15
IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")

# Secrets: TCP-MD5 (RFC 2385) keys are at most 80 characters on every supported NOS; OSPF keys
# 16 (RFC 2328 message-digest, FRR truncates longer ones silently) or 64 (HMAC-SHA). Printable
# ASCII without whitespace: FRR ends a key at whitespace, and a control character would end
# the configuration line it is written on.
BGP_PASSWORD_MAX = 80
MD5_KEY_MAX = 16
HMAC_KEY_MAX = 64

# One-line free text that never reaches a device (e.g. the ack audit's ``acked_by``).
LABEL_MAX = 128

_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\0": "a NUL", " ": "a space"}


def describe_char(ch: str) -> str:
    """``a newline (U+000A)``, ``'#' (U+0023)``, ``LINE SEPARATOR (U+2028)``."""
    code = f"U+{ord(ch):04X}"
    if ch in _NAMES:
        return f"{_NAMES[ch]} ({code})"
    if ch.isprintable() and not ch.isspace():
        return f"{ch!r} ({code})"
    return f"{unicodedata.name(ch, 'a control character')} ({code})"


def _first_outside(value: str, allowed: re.Pattern[str]) -> str | None:
    return next((ch for ch in value if not allowed.fullmatch(ch)), None)


_NAME_CHAR = re.compile(r"[A-Za-z0-9-]")
_IFNAME_CHAR = re.compile(r"[A-Za-z0-9_.-]")


def switch_name_problem(value: str) -> str | None:
    """Empty (unset) or an RFC 1123 host label every NOS accepts as a hostname."""
    if not value:
        return None
    if len(value) > SWITCH_NAME_MAX:
        return f"at most {SWITCH_NAME_MAX} characters (got {len(value)})"
    if SWITCH_NAME.fullmatch(value):
        return None
    bad = _first_outside(value, _NAME_CHAR)
    found = f"; found {describe_char(bad)}" if bad else ""
    return (
        "must be a hostname every switch NOS accepts: ASCII letters, digits and inner hyphens, "
        f"starting with a letter{found}"
    )


def ifname_problem(value: str) -> str | None:
    """Empty (unset) or a Linux interface name (≤ 15 characters, no '/', ':' or whitespace)."""
    if not value:
        return None
    if len(value) > IFNAME_MAX:
        return f"a Linux interface name is at most {IFNAME_MAX} characters (got {len(value)})"
    if IFNAME.fullmatch(value):
        return None
    bad = _first_outside(value, _IFNAME_CHAR)
    found = f"; found {describe_char(bad)}" if bad else ""
    return (
        "is not a Linux interface name: ASCII letters, digits, '_', '.', '-', starting with a "
        f"letter or digit{found}"
    )


def secret_problem(value: str, max_len: int) -> str | None:
    """Empty (unchanged) or printable ASCII without whitespace, at most ``max_len`` characters.
    Never names the offending character: it is part of a secret."""
    if len(value) > max_len:
        return f"at most {max_len} characters"
    if any(ch.isspace() for ch in value):
        return "must not contain whitespace (FRR cuts keys there)"
    if any(not "!" <= ch <= "~" for ch in value):
        return "must be printable ASCII (no control or non-ASCII characters)"
    return None


def label_problem(value: str, max_len: int = LABEL_MAX) -> str | None:
    """One line of printable text (a name for an audit log): no control, line or paragraph
    separator characters, at most ``max_len`` characters."""
    if len(value) > max_len:
        return f"at most {max_len} characters (got {len(value)})"
    bad = next((ch for ch in value if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")), None)
    return f"must be one line of printable text; found {describe_char(bad)}" if bad else None


_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")


def hostname_problem(value: str) -> str | None:
    """A host name or FQDN (RFC 1123): dot-separated labels of letters, digits and inner hyphens,
    each at most 63 characters, at most 253 in all; no space, control or shell character."""
    if not value or len(value) > 253:
        return "must be a host name of 1 to 253 characters"
    bad = _first_outside(value, re.compile(r"[A-Za-z0-9.-]"))
    if bad is not None:
        return f"letters, digits, '-' and '.' only; found {describe_char(bad)}"
    if not all(_HOST_LABEL.fullmatch(label) for label in value.split(".")):
        return "each dot-separated label: 1 to 63 letters, digits or inner hyphens"
    return None


def username_problem(value: str) -> str | None:
    """A login name as useradd takes it: a letter or '_' then letters, digits, '.', '_' or '-',
    at most 32 characters (no space, shell metacharacter or control character)."""
    if _USER_NAME.fullmatch(value):
        return None
    bad = _first_outside(value, re.compile(r"[A-Za-z0-9._-]"))
    found = f"; found {describe_char(bad)}" if bad is not None else ""
    return f"must be 1 to 32 letters, digits, '.', '_' or '-', starting with a letter or '_'{found}"


def ssh_password_problem(value: str) -> str | None:
    """A password Karios logs in with over SSH: SSH sends it SASLprepped (RFC 4013, asyncssh's
    :func:`saslprep`), which refuses control, private-use and non-character code points and
    those Unicode 3.2 had not assigned. Never names the character: it is part of a secret."""
    from asyncssh.saslprep import SASLPrepError, saslprep  # asyncssh is ~0.15 s of a start-up

    try:
        saslprep(value)
    except SASLPrepError:
        return (
            "SSH cannot send this password: it holds a control, private-use or unassigned "
            "character (SASLprep, RFC 4013)"
        )
    return None


def check_ssh_password(value: str) -> str:
    return _raise_on(ssh_password_problem(value), value)


def check_hostname(value: str) -> str:
    return _raise_on(hostname_problem(value), value)


def check_username(value: str) -> str:
    return _raise_on(username_problem(value), value)


def _raise_on(problem: str | None, value: str) -> str:
    if problem:
        raise ValueError(problem)
    return value


def check_switch_name(value: str) -> str:
    return _raise_on(switch_name_problem(value), value)


def check_ifname(value: str) -> str:
    return _raise_on(ifname_problem(value), value)


def check_bgp_password(value: str) -> str:
    return _raise_on(secret_problem(value, BGP_PASSWORD_MAX), value)


def check_ospf_auth_key(value: str) -> str:
    """The longest key any OSPF auth type takes (HMAC); the type's own limit is a stored-config
    rule, as the type may be the stored one."""
    return _raise_on(secret_problem(value, HMAC_KEY_MAX), value)


def check_label(value: str) -> str:
    return _raise_on(label_problem(value), value)


# The checker of each field DeviceTextRules validates.
_DEVICE_TEXT = {
    "fabric_switch_name": check_switch_name,
    "ospf_fabric_interface": check_ifname,
    "bgp_password": check_bgp_password,
    "ospf_auth_key": check_ospf_auth_key,
    "acked_by": check_label,
}


class DeviceTextRules(BaseModel):
    """Mixin of the API input models: every free-text field that lands in a switch or node
    configuration is checked against its grammar (422 naming the field). Deliberately not on
    ``FabricConfigFields``: a row stored before these rules must still load and be shown."""

    @field_validator(*_DEVICE_TEXT, check_fields=False)
    @classmethod
    def _device_text(cls, value: str, info: ValidationInfo) -> str:
        return _DEVICE_TEXT[info.field_name](value)


# -- the renderers' own guard ----------------------------------------------------------------
# The API refuses bad text (above), but a renderer must not trust that every value came through
# it (a row stored before these rules, a hostname read from a node): no value may carry a
# character that ends a configuration line.
_LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


class UnsafeRenderValue(ValidationFailed):
    """A value holding a line break or control character reached a configuration renderer
    (a 422 naming the field where it reaches the API)."""

    def __init__(self, field: str, ch: str) -> None:
        super().__init__(f"{field}: {describe_char(ch)} cannot go into a rendered configuration", field=field)


def guard_render_values(values: dict[str, object], fields: dict[str, str] | None = None) -> None:
    """Raise :class:`UnsafeRenderValue` naming the field (``fields`` maps a template variable
    to the API field it came from) when any string value could start a line of its own."""
    for key, value in values.items():
        if isinstance(value, str) and (m := _LINE_BREAKING.search(value)):
            raise UnsafeRenderValue((fields or {}).get(key, key), m.group())
