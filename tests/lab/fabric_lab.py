"""Compute-node lab: network namespaces running real OpenSSH and FRR. See README.md in this folder.

The lab is defined once, in ``cli/src/karios/cli/demo_fabric.py`` (``karios demo --fabric`` runs
the same lab for a newcomer); this module re-exports it under the name the tests, benchmarks and
the self-test import. Stdlib only: with a bare ``python3`` (no Karios installed) the CLI's source
folder is put on the path.
"""

from __future__ import annotations

import os
import sys

try:
    from karios.cli import demo_fabric as _lab
except ImportError:  # `python3 tests/lab/selftest_fabric_lab.py` outside the uv environment
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cli", "src"))
    from karios.cli import demo_fabric as _lab

FABRIC_IP = _lab.FABRIC_IP
HOST_IP = _lab.HOST_IP
LOCK_DIR = _lab.LOCK_DIR
MAX_NODES = _lab.MAX_NODES
PACKAGES = _lab.PACKAGES
UNDERLAY_PREFIX = _lab.UNDERLAY_PREFIX
FabricLab = _lab.FabricLab
LabNode = _lab.LabNode
cleanup_leftovers = _lab.cleanup_leftovers
ensure_packages = _lab.ensure_packages
loopback_ip = _lab.loopback_ip
missing_packages = _lab.missing_packages
skip_reason = _lab.skip_reason
underlay_ip = _lab.underlay_ip
# The few helpers the self-test uses to look behind the lab's back.
_destroy_netns = _lab._destroy_netns
_list_netns = _lab._list_netns
_netns_pids = _lab._netns_pids
_read_pid = _lab._read_pid
