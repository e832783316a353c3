"""VTEP pool arithmetic: .0/.255 of every /24 excluded, the switch address reserved."""

from __future__ import annotations

import pytest

from karios.fabric_worker.config.pool import VtepPool, auto_prefix


@pytest.mark.parametrize(
    ("base", "prefix", "reserved", "start", "total"),
    [
        ("10.255.0.1", 24, [], "10.255.0.1", 254),
        ("10.255.0.0", 24, [], "10.255.0.1", 254),
        ("10.255.0.0", 23, [], "10.255.0.1", 508),
        ("10.255.0.0", 22, ["10.255.0.254"], "10.255.0.1", 1015),
        ("10.255.0.10", 24, [], "10.255.0.10", 245),
        ("10.255.0.0", 30, [], "10.255.0.1", 3),
        ("10.255.0.0", 24, ["192.168.1.1"], "10.255.0.1", 254),
    ],
)
def test_pool_counts(base, prefix, reserved, start, total):
    pool = VtepPool.of(base, prefix, reserved)
    assert str(pool.start) == start
    assert pool.total_usable == total == len(list(pool.addresses()))


def test_first_free_skips_taken_boundaries_and_reserved():
    pool = VtepPool.of("10.255.0.250", 23, ["10.255.1.1"])
    taken = {"10.255.0.250", "10.255.0.251", "10.255.0.252", "10.255.0.253", "10.255.0.254"}
    assert pool.first_free(taken) == "10.255.1.2"
    assert (
        not pool.contains("10.255.0.255") and not pool.contains("10.255.1.1") and pool.contains("10.255.1.2")
    )


@pytest.mark.parametrize(("nodes", "prefix"), [(0, 24), (1, 24), (200, 24), (203, 23), (400, 23), (1000, 21)])
def test_auto_prefix_keeps_a_quarter_headroom_and_never_goes_below_slash_24(nodes, prefix):
    assert auto_prefix(nodes) == prefix
