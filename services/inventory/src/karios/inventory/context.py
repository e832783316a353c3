"""The ``karios`` key of a NetBox config context → OS users, SSH keys, gateway, nameservers. Pure.

NetBox renders a device's ``config_context`` from every context that applies to it (site, role,
platform, tag, …) plus the device's own local context data; Karios reads one key of it::

    {"karios": {"users": [{"name": "ops", "ssh_authorized_keys": ["ssh-ed25519 AAAA…"],
                           "sudo": true, "password_hash": "$6$…"}],
                "network": {"gateway": "10.0.0.1", "nameservers": ["10.0.0.53"]}}}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from karios.common.contracts.inventory import HostUser

Json = Mapping[str, Any]


def _get(obj: Any, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _str(value: Any) -> str:
    return "" if value is None else str(value)


#: The config-context key Karios reads (docs/inventory.md "Users, keys and the static address").
CONTEXT_KEY = "karios"


_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_NO_SPACE = re.compile(r"^[^\s\"'\\]+$")  # a crypt hash or shell path: one word, no quotes


def _key_ok(key: Any) -> bool:
    """An authorized_keys line rendered inside double quotes: one line, no double quote."""
    return isinstance(key, str) and bool(key.strip()) and not any(c in key for c in '"\n\r')


def users_from_context(context: Json | None) -> list[HostUser]:
    """``karios.users`` of a rendered config context. Entries that cannot be rendered safely (a
    name that is no Linux user name, a hash or shell with spaces or quotes) are skipped, and keys
    with a double quote or a line break are dropped."""
    raw = _get(context, CONTEXT_KEY, "users")
    out: list[HostUser] = []
    for u in raw if isinstance(raw, list) else []:
        if not isinstance(u, Mapping):
            continue
        name = _str(u.get("name")).strip()
        pw_hash = _str(u.get("password_hash")).strip()
        shell = _str(u.get("shell")).strip()
        if not _USER.match(name) or any(v and not _NO_SPACE.match(v) for v in (pw_hash, shell)):
            continue
        keys = u.get("ssh_authorized_keys")
        out.append(
            HostUser(
                name=name,
                ssh_authorized_keys=[k.strip() for k in keys if _key_ok(k)] if isinstance(keys, list) else [],
                sudo=u.get("sudo") is True,
                password_hash=pw_hash,
                shell=shell,
            )
        )
    return out


def network_from_context(context: Json | None) -> tuple[str, list[str]]:
    """(gateway, nameservers) of the primary IPv4 from ``karios.network`` ('' / [] when unset;
    bootapi then uses the network's first usable address as the gateway)."""
    net = _get(context, CONTEXT_KEY, "network")
    net = net if isinstance(net, Mapping) else {}
    servers = net.get("nameservers")
    names = [_str(x).strip() for x in servers if _str(x).strip()] if isinstance(servers, list) else []
    return _str(net.get("gateway")).strip(), names
