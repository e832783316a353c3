"""Issue 24 S5, the pure rules behind node adoption's 422s: which addresses are a host's, the
grammar of a host name and of a login name."""

from __future__ import annotations

import pytest

from karios.common.devicetext import hostname_problem, username_problem
from karios.common.netaddr import host_address_problem


@pytest.mark.parametrize(
    ("ip", "kind"),
    [
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("255.255.255.255", "broadcast"),
        ("224.0.0.5", "multicast"),
        ("ff02::1", "multicast"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("240.0.0.1", "reserved"),
    ],
)
def test_addresses_that_are_no_hosts(ip: str, kind: str):
    problem = host_address_problem(ip)
    assert problem is not None and f" {kind} address" in problem and problem.startswith(ip)


def test_host_addresses_and_the_loopback_exception():
    for ip in ("10.0.0.5", "192.0.2.10", "198.18.0.3", "2001:db8::5", "::ffff:10.1.2.3", "100.64.0.1"):
        assert host_address_problem(ip) is None, ip
    assert host_address_problem("127.0.0.1", allow_loopback=True) is None
    assert host_address_problem("::1", allow_loopback=True) is None
    assert host_address_problem("0.0.0.0", allow_loopback=True) is not None  # only loopback is allowed


@pytest.mark.parametrize(
    "name", ["node1", "node-1.example.com", "a", "A1-b2", "x" * 63, ".".join(["abc"] * 60)]
)
def test_host_names(name: str):
    assert hostname_problem(name) is None


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("node1\nlogger x", "a newline (U+000A)"),
        ("node\x07", "U+0007"),
        ("node one", "a space"),
        ("node;id", "';' (U+003B)"),
        ("-node", "label"),
        ("node-", "label"),
        ("a..b", "label"),
        ("x" * 64, "label"),
        ("", "1 to 253"),
        ("a." * 127 + "ab", "1 to 253"),
        ("nöde", "U+00F6"),
    ],
)
def test_host_names_refused(name: str, says: str):
    problem = hostname_problem(name)
    assert problem is not None and says in problem, problem


@pytest.mark.parametrize("user", ["root", "debian", "_svc", "ops.team", "a-b_c", "Admin", "u" * 32])
def test_user_names(user: str):
    assert username_problem(user) is None


@pytest.mark.parametrize(
    "user",
    ["root; id", "root\nid", "$(id)", "ro`ot`", "a b", "root|id", "root&", "9root", "", "u" * 33, "-r"],
)
def test_user_names_refused(user: str):
    assert username_problem(user) is not None
