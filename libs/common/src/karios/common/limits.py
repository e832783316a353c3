"""Input limits declared once: text without NUL bytes or lone surrogates, bounded lengths,
integers that fit the database columns. Request and contract models reuse these types, and
``tests/unit/common/test_limits.py`` checks every table column against them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from karios.common.devicetext import check_ssh_password, check_username
from karios.common.netaddr import normalize_ip

#: Longest stored address (``varchar(64)`` columns: bmc_ip, node_ip, os_ip …).
IP_MAX = 64
#: A DNS name (RFC 1035) and one of its labels.
FQDN_MAX = 253
LABEL_MAX = 63
#: Job ids (uuid4 strings; ``parent_id`` batches) — ``varchar(64)`` columns.
ID_MAX = 64
#: User names, vendors, serial numbers and other short free text.
NAME_MAX = 128
#: BMC driver names (``varchar(32)`` vendor columns of jobs).
VENDOR_MAX = 32
#: Passwords and other secrets as typed by an operator (before encryption).
SECRET_MAX = 1024
#: Any other free text field without a stricter rule.
TEXT_MAX = 4096
#: SecretBox ciphertext of a ``TEXT_MAX``-character value ("v1:<kid>:<nonce>:<base64>": up to
#: 4 UTF-8 bytes a character, the GCM tag, base64's 4/3 and the header) — encrypting any bounded
#: secret yields a valid contract field.
CIPHERTEXT_MAX = 4 * -(-(4 * TEXT_MAX + 16) // 3) + 256
#: PostgreSQL ``integer`` (int4).
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def check_text(value: str) -> str:
    """Refuse NUL bytes (PostgreSQL text cannot hold them) and lone surrogates (not encodable)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL bytes")
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ValueError("must not contain lone surrogates (invalid Unicode)")
    return value


def _check_optional_ip(value: str | None) -> str | None:
    return normalize_ip(value) if value else None


#: Text without NUL or lone surrogates; the field gives its own ``max_length`` (a length here
#: would win over the field's in the schema and in validation).
SafeText = Annotated[str, AfterValidator(check_text)]
#: Free text of any length up to ``TEXT_MAX`` without NUL or lone surrogates.
Text = Annotated[str, StringConstraints(max_length=TEXT_MAX), AfterValidator(check_text)]
#: Short names (user names, vendors, serial numbers).
Name = Annotated[str, StringConstraints(max_length=NAME_MAX), AfterValidator(check_text)]
#: A host name or FQDN (its form is checked where it is used; here: length and characters).
HostName = Annotated[str, StringConstraints(max_length=FQDN_MAX), AfterValidator(check_text)]
#: A BMC driver name.
Vendor = Annotated[str, StringConstraints(max_length=VENDOR_MAX), AfterValidator(check_text)]
#: One DNS label (a provisioned host's short name).
Label = Annotated[str, StringConstraints(max_length=LABEL_MAX), AfterValidator(check_text)]
#: A job id or a batch id.
Ident = Annotated[str, StringConstraints(max_length=ID_MAX), AfterValidator(check_text)]
#: A secret before encryption.
Secret = Annotated[str, StringConstraints(max_length=SECRET_MAX), AfterValidator(check_text)]
#: A password Karios logs in with over SSH (SASLprep must take it: ``check_ssh_password``).
SshPassword = Annotated[
    str,
    StringConstraints(max_length=SECRET_MAX),
    AfterValidator(check_text),
    AfterValidator(check_ssh_password),
]
#: A Linux login name (``check_username``: useradd's grammar, at most 32 characters).
LoginName = Annotated[str, StringConstraints(max_length=NAME_MAX), AfterValidator(check_username)]
#: A secret after encryption (SecretBox text; the columns are unbounded ``varchar``).
Ciphertext = Annotated[str, StringConstraints(max_length=CIPHERTEXT_MAX), AfterValidator(check_text)]
#: What the published schema says of an address, so generated data (and a UI) gets the form.
IP_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "string", "format": "ipv4"}, {"type": "string", "format": "ipv6"}]
}
#: An IP address (IPv4, IPv6, scoped IPv6) that fits the ``varchar(64)`` address columns.
BoundedIP = Annotated[
    str,
    StringConstraints(max_length=IP_MAX),
    AfterValidator(check_text),
    AfterValidator(normalize_ip),
    Field(json_schema_extra=IP_SCHEMA),
]
OptBoundedIP = Annotated[
    str | None,
    Field(
        max_length=IP_MAX,
        json_schema_extra={
            "anyOf": [*IP_SCHEMA["anyOf"], {"type": "string", "maxLength": 0}, {"type": "null"}]
        },
    ),
    AfterValidator(lambda v: None if v is None else check_text(v)),
    AfterValidator(_check_optional_ip),
]
#: An address as an installer reports it ("" = unknown), else an IP address (issue 24 D8: a
#: /complete with "999.1.1.1" was stored as the node's address).
IPText = Annotated[
    str,
    StringConstraints(max_length=IP_MAX),
    AfterValidator(check_text),
    AfterValidator(lambda v: normalize_ip(v) if v else ""),
]
#: A PostgreSQL ``integer`` that is a database id (NetBox ids are positive).
Int32Id = Annotated[int, Field(ge=0, le=INT32_MAX)]
#: Any PostgreSQL ``integer``.
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
