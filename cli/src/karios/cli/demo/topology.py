"""The fabric lab's addressing and its node record. Everything stays in 198.18.0.0/15 (RFC 2544
benchmarking space): never routed anywhere."""

from __future__ import annotations

import dataclasses

FABRIC_IP = "198.18.0.1"  # fabric bridge; the route reflector listens here
HOST_IP = "198.18.0.254"  # root-namespace end of the optional host link
UNDERLAY_PREFIX = 24
MAX_NODES = 240


def underlay_ip(index: int) -> str:
    """Node N (1-based) gets 198.18.0.(10+N): 198.18.0.11, .12, ..."""
    return f"198.18.0.{10 + index}"


def loopback_ip(index: int) -> str:
    """Node N (1-based) gets the /32 198.19.0.(10+N) on `lo`."""
    return f"198.19.0.{10 + index}"


@dataclasses.dataclass
class LabNode:
    """One compute node: a network namespace with its own sshd, hostname and /etc/frr."""

    index: int
    name: str  # hostname inside the node, e.g. "node1"
    netns: str  # `ip netns` name, unique per lab
    underlay_ip: str
    loopback_ip: str
    mtu: int
    ssh_host: str
    ssh_port: int
    username: str
    private_key_path: str
    host_public_key: str  # "ssh-ed25519 AAAA..."
    host_key_fingerprint: str  # "SHA256:..."
    etc_frr_dir: str  # host path bind-mounted on the node's /etc/frr
    run_frr_dir: str  # host path bind-mounted on the node's /run/frr
    sshd_pid: int = 0
