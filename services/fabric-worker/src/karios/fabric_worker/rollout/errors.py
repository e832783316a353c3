"""Rollout errors: asyncssh and node-side failures are translated into these exactly once,
in :mod:`karios.fabric_worker.rollout.ssh` and :mod:`karios.fabric_worker.rollout.node`."""

from __future__ import annotations

from karios.common.errors import Conflict, KariosError, UpstreamError, register_error


@register_error
class NodeUnreachable(UpstreamError):
    """SSH could not connect or authenticate: no step ran on the node."""

    code = "NODE_UNREACHABLE"


@register_error
class HostKeyChanged(Conflict):
    """The node presented a host key other than the stored one (possible impersonation)."""

    code = "HOST_KEY_CHANGED"
    retryable = False


@register_error
class HostKeyMismatch(Conflict):
    """At adoption, the node presented a host key other than the one the operator gave
    (``ssh_host_key_fingerprint``): nothing was sent to it, nothing stored."""

    code = "HOST_KEY_MISMATCH"
    retryable = False


@register_error
class NodeCommandFailed(UpstreamError):
    """A command on the node exited non-zero or timed out."""

    code = "NODE_COMMAND_FAILED"


@register_error
class FabricVerifyFailed(UpstreamError):
    """The node did not reach the verified state (BGP Established, EVPN routes) in time."""

    code = "FABRIC_VERIFY_FAILED"


@register_error
class RolloutCancelled(KariosError):
    """The job was cancelled (by the operator or by strict mode after another node failed)."""

    code = "ROLLOUT_CANCELLED"
    http_status = 409
