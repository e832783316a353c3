from karios.common.netaddr import ip_sort_key


def test_mixed_versions_sort_v4_first_numerically_and_garbage_last():
    ips = ["2001:db8::7", "198.18.0.13", "10.0.0.2", "not-an-ip", "10.0.0.10", "fe80::1%eth0"]
    assert sorted(ips, key=ip_sort_key) == [
        "10.0.0.2",
        "10.0.0.10",
        "198.18.0.13",
        "2001:db8::7",
        "fe80::1%eth0",
        "not-an-ip",
    ]
