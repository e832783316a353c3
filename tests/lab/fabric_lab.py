"""Compute-node lab: network namespaces running real OpenSSH and FRR. See README.md in this folder.

The lab is defined once, in the package ``cli/src/karios/cli/demo/`` (``lab.py`` and the modules
it builds on; ``karios demo --fabric`` runs the same lab for a newcomer); this module re-exports it
under the name the tests, benchmarks and the self-test import. Stdlib only: with a bare
``python3`` (no Karios installed) the CLI's source folder is put on the path.
"""

from __future__ import annotations

import os
import sys

try:
    from karios.cli.demo import host, lab, netns, packages, topology
except ImportError:  # `python3 tests/lab/selftest_fabric_lab.py` outside the uv environment
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cli", "src"))
    from karios.cli.demo import host, lab, netns, packages, topology

FABRIC_IP = topology.FABRIC_IP
HOST_IP = topology.HOST_IP
LOCK_DIR = host.LOCK_DIR
MAX_NODES = topology.MAX_NODES
PACKAGES = packages.PACKAGES
UNDERLAY_PREFIX = topology.UNDERLAY_PREFIX
FabricLab = lab.FabricLab
LabNode = topology.LabNode
cleanup_leftovers = lab.cleanup_leftovers
ensure_packages = packages.ensure_packages
loopback_ip = topology.loopback_ip
missing_packages = packages.missing_packages
skip_reason = packages.skip_reason
underlay_ip = topology.underlay_ip
# The few helpers the self-test uses to look behind the lab's back.
_destroy_netns = netns.destroy_netns
_list_netns = netns.list_netns
_netns_pids = netns.netns_pids
_read_pid = host.read_pid


def require_lab() -> None:
    """In a test: skip when this machine cannot run the lab (not root, no netns…), but fail
    under CI (``CI=true``), where the lab is a requirement and a skip would hide its tests."""
    reason = skip_reason()
    if not reason:
        return
    import pytest  # only tests call this; the self-test and benchmarks run without pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"fabric lab required in CI: {reason}", pytrace=False)
    pytest.skip(reason)
