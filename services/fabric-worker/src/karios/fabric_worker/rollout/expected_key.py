"""Adoption with the host key the operator expects (``ssh_host_key_fingerprint``), instead of
trusting whatever key answers first.

Before any login (no password or key is offered): the node's host key is fetched by a key
exchange alone (``asyncssh.get_server_host_key``, as ``ssh-keyscan`` does) and its SHA256
fingerprint compared with the expected one. A server has one key per type and the key exchange
picks one, so when the first does not match, each other type is asked for in turn. No match:
409 ``HOST_KEY_MISMATCH`` naming the field, with the expected and the presented fingerprints.
A match becomes the target's known key, so the session that logs in must present that very key
(asyncssh checks it in the handshake: no window for another host to answer in between).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncssh

from karios.fabric_worker.rollout.errors import HostKeyMismatch, NodeUnreachable
from karios.fabric_worker.rollout.intent import NodeTarget

FIELD = "ssh_host_key_fingerprint"
#: Host key algorithms asked for one by one when the first key presented is not the expected one.
KEY_ALGS = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "ssh-ed448",
)


async def _presented(target: NodeTarget, algs: Sequence[str], limit_s: float) -> asyncssh.SSHKey | None:
    """The host key the node presents for one of `algs` (() = its first choice); None when it
    has no key of those types (sshd ends the key exchange: "no matching host key type")."""
    try:
        return await asyncio.wait_for(
            asyncssh.get_server_host_key(
                target.host, target.ssh_port, server_host_key_algs=algs or (), config=None
            ),
            limit_s,
        )
    except TimeoutError:
        raise NodeUnreachable(f"{target.label}: SSH connect timed out after {limit_s:.0f} s") from None
    except (asyncssh.Error, OSError) as exc:
        if algs:  # the node answered the first key exchange: it has no key of these types (sshd
            return None  # ends the exchange, a disconnect or a reset depending on timing)
        raise NodeUnreachable(f"{target.label}: SSH connect failed: {exc}") from None


def _fp(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


async def expect_host_key(target: NodeTarget, expected: str, *, limit_s: float = 10.0) -> NodeTarget:
    """`target` whose session must present the key with fingerprint `expected`; raises
    :class:`HostKeyMismatch` (409, field ``ssh_host_key_fingerprint``) when the node has no such
    key, and :class:`NodeUnreachable` (502) when it cannot be reached. Nothing is sent but the key
    exchange."""
    seen: dict[str, str] = {}  # fingerprint -> key type, in the order presented
    first = await _presented(target, (), limit_s)
    keys = [first] if first is not None else []
    for key in keys:
        seen[_fp(key)] = key.get_algorithm()
    if expected not in seen:
        for alg in KEY_ALGS:
            if any(a == alg or (alg.startswith("rsa") and a == "ssh-rsa") for a in seen.values()):
                continue  # this type was presented already
            key = await _presented(target, (alg,), limit_s)
            if key is None:
                continue
            keys.append(key)
            seen[_fp(key)] = key.get_algorithm()
            if expected in seen:
                break
    match = next((k for k in keys if _fp(k) == expected), None)
    if match is None:
        presented = ", ".join(f"{fp} ({alg})" for fp, alg in seen.items()) or "no host key"
        raise HostKeyMismatch(
            f"{FIELD}: {target.label} presented {presented}, not the expected {expected}; refusing "
            "to adopt it (no login was attempted, nothing stored)",
            field=FIELD,
            details={"expected": expected, "presented": list(seen)},
        )
    if target.known_host_key is not None:
        return target  # an earlier pin is checked by the session as before (HOST_KEY_CHANGED)
    key_line = match.export_public_key("openssh").decode().strip()
    return target.model_copy(update={"known_host_key": key_line})
