"""Compute nodes joining or leaving the node set (asked by the inventory): pin a node's SSH host
key on first contact through the rollout's own SSH adapter and pin store, and release a node
(refused while it holds fabric state). Both are refused (409 ``FABRIC_JOB_RUNNING`` naming the
job) while a fabric job runs: the inventory asks before it writes, so the node set does not
change under an apply or teardown. A first boot (``reinstalled``) is not refused: it reports a
reinstall that already happened.

- ``req.fabric.pin_host_key``  :func:`pin_host_key` (adoption: one connection, nothing run)
- ``req.fabric.release_node``  :func:`release_node`
"""

from __future__ import annotations

from functools import partial

import asyncssh
from asyncssh.saslprep import SASLPrepError, saslprep

from karios.common.contracts.nodes import (
    PinnedHostKey,
    PinNodeHostKey,
    ReleasedFabricNode,
    ReleaseFabricNode,
    private_key_context,
)
from karios.common.errors import Conflict, ValidationFailed
from karios.common.telemetry import get_logger
from karios.fabric_worker.rollout.access import adoption_target, private_key
from karios.fabric_worker.rollout.errors import NodeUnreachable
from karios.fabric_worker.rollout.expected_key import expect_host_key
from karios.fabric_worker.rollout.service import RolloutService
from karios.fabric_worker.rollout.ssh import open_session

log = get_logger(__name__)


def fingerprint(host_key: str) -> str:
    """``SHA256:<base64>`` as ``ssh-keygen -l`` prints it."""
    return asyncssh.import_public_key(host_key).get_fingerprint("sha256")


def _check_credentials(svc: RolloutService, q: PinNodeHostKey) -> None:
    try:  # asyncssh SASLpreps the user name before it connects (found by the gateway fuzzer: a 500)
        saslprep(q.os_username)
    except SASLPrepError as exc:
        raise ValidationFailed(
            f"ssh_username: not usable as an SSH user name ({exc})", field="ssh_username"
        ) from None
    if not q.ssh_private_key_enc:
        return
    text = svc.box.decrypt(q.ssh_private_key_enc, context=private_key_context(q.node_ip))
    try:
        asyncssh.import_private_key(text)
    except (asyncssh.KeyImportError, ValueError):
        raise ValidationFailed(
            "ssh_private_key: not an unencrypted OpenSSH or PEM private key", field="ssh_private_key"
        ) from None


# What an SSH server said after the connection was made: a caller may know it (no port scan in it).
_LOGIN_ANSWERS = ("SSH authentication failed", "the stored SSH private key cannot be read")


def _one_answer(q: PinNodeHostKey, exc: NodeUnreachable) -> NodeUnreachable:
    """Issue 24 S5: whether the port refused, the connection was lost or timed out, or the address
    is unreachable is not told to the caller (adoption would be a port scanner): one message; the
    cause goes to this worker's log. A login refused by the node's sshd is still said."""
    if exc.message.endswith(_LOGIN_ANSWERS):
        return exc
    log.warning("adoption: no SSH connection", node_ip=q.node_ip, ssh_port=q.ssh_port, cause=exc.message)
    return NodeUnreachable(
        f"{q.node_ip} port {q.ssh_port}: could not connect over SSH (no answer, refused or closed "
        "before the login; the fabric worker's log has the cause)"
    )


async def pin_host_key(svc: RolloutService, q: PinNodeHostKey) -> PinnedHostKey:
    """Connect once (the pinned key, if any, must match: 409 HOST_KEY_CHANGED); unreachable or
    login refused: 502 NODE_UNREACHABLE naming address and cause. A first-seen key is pinned. With
    an expected fingerprint the node must present that key before any login (409
    HOST_KEY_MISMATCH, :mod:`~karios.fabric_worker.rollout.expected_key`); without, first use."""
    _check_credentials(svc, q)
    await svc.repo.check_idle()  # 409 FABRIC_JOB_RUNNING: no SSH contact, nothing pinned
    pinned = (await svc.repo.host_keys([q.node_ip])).get(q.node_ip)
    known = pinned or q.known_host_key
    use_worker_key = not (q.os_password_enc or q.ssh_private_key_enc)
    target = adoption_target(q, svc.box, private_key(svc.settings) if use_worker_key else None, known)
    try:
        if q.expected_host_key_fingerprint:  # 409 HOST_KEY_MISMATCH before any login is tried
            target = await expect_host_key(target, q.expected_host_key_fingerprint, limit_s=q.connect_timeout)
        async with open_session(target, connect_timeout=q.connect_timeout) as session:
            host_key, first = session.host_key, known is None
    except NodeUnreachable as exc:
        raise _one_answer(q, exc) from None
    await svc.repo.check_idle()  # again: a job may have started during the SSH contact
    if pinned is None:
        await svc.remember({q.node_ip: host_key})
        now_pinned = (await svc.repo.host_keys([q.node_ip])).get(q.node_ip)
        if now_pinned != host_key:  # pinned by another contact meanwhile
            raise Conflict(f"{q.node_ip}: host key changed while adopting; refusing", field="node_ip")
    return PinnedHostKey(
        node_ip=q.node_ip, host_key=host_key, fingerprint=fingerprint(host_key), first_seen=first
    )


async def release_node(svc: RolloutService, q: ReleaseFabricNode) -> ReleasedFabricNode:
    """Forget the node's pinned key; refused (409) while a VTEP is allocated to it, unless the
    node was just reinstalled (its first boot: the old key is void, the fabric state stays)."""
    if not q.reinstalled:
        await svc.repo.check_idle()  # 409 FABRIC_JOB_RUNNING naming the job
        vtep = await svc.repo.allocation_of(q.node_ip)
        if vtep is not None:
            raise Conflict(
                f"node_ip: {q.node_ip} holds fabric state (VTEP {vtep}); tear it down first "
                f"(DELETE /controlnode/fabric-config/node/{q.node_ip}), then remove it",
                field="node_ip",
                details={"node_ip": q.node_ip, "vtep_ip": vtep},
            )
    forgotten = await svc.repo.forget_host_key(q.node_ip)
    return ReleasedFabricNode(node_ip=q.node_ip, host_key_forgotten=forgotten)


def register_nodes(svc: RolloutService) -> None:
    bus, sub = svc.rt.bus, svc.rt.bus.subjects
    bus.query_responder(sub.request("fabric", "pin_host_key"), PinNodeHostKey, partial(pin_host_key, svc))
    bus.query_responder(sub.request("fabric", "release_node"), ReleaseFabricNode, partial(release_node, svc))
