"""The worker's memo of the last stored preflight (issue 28: an apply refused for the same
preflight does not parse 1,000 verdicts again): equal to judging afresh, and never stale."""

from __future__ import annotations

from karios.fabric_worker.rollout import judge


def _stored(n: int, *, unreachable: set[int] = frozenset(), mtu: int = 9000) -> list[dict]:
    return [
        {
            "node_ip": f"10.0.{i // 250}.{i % 250 + 1}",
            "fqdn": f"n{i}",
            "mode": "unreachable" if i in unreachable else "reuse",
            "bridge": "br0",
            "bridge_mtu": mtu,
            "reason": "no route" if i in unreachable else "",
        }
        for i in range(n)
    ]


def _afresh(stored: list[dict], targets: frozenset[str], vxlan_mtu: int, needed: int = 0) -> list:
    seen = {n["node_ip"]: judge.NodeSeen(**n) for n in stored}
    return judge.blockers(
        [n for ip, n in seen.items() if ip in targets],
        vxlan_mtu=vxlan_mtu,
        capacity=250,
        needed=needed,
        prefix_len=24,
    )


def _memo_blockers(memo: judge.VerdictMemo, stored, targets, vxlan_mtu, needed=0) -> list:
    return memo.blockers(stored, targets, vxlan_mtu=vxlan_mtu, capacity=250, needed=needed, prefix_len=24)


def test_the_memo_answers_what_judging_afresh_answers_and_follows_a_new_preflight() -> None:
    memo = judge.VerdictMemo()
    first = _stored(300, unreachable={3, 7})
    everyone = frozenset(n["node_ip"] for n in first)
    got = _memo_blockers(memo, first, everyone, 9000, needed=300)
    assert got == _afresh(first, everyone, 9000, needed=300)
    assert [b.kind for b in got] == [
        "unreachable",
        "unreachable",
        "pool_headroom",
    ]  # 300 nodes, 250 addresses
    assert sorted(b.fqdn for b in got if b.kind == "unreachable") == ["n3", "n7"]
    # Asked again (a fresh list read from the row, equal): the same verdicts, not parsed again.
    parsed = memo.seen(first)
    assert memo.seen([dict(n) for n in first]) is parsed
    assert _memo_blockers(memo, [dict(n) for n in first], everyone, 9000, needed=300) == got
    # A new preflight (node 3 fixed, node 9 now unreachable) is judged afresh.
    second = _stored(300, unreachable={7, 9})
    again = _memo_blockers(memo, second, everyone, 9000, needed=300)
    assert sorted(b.fqdn for b in again if b.kind == "unreachable") == ["n7", "n9"]
    assert memo.seen(second) is not parsed


def test_other_targets_and_mtus_are_judged_each_on_their_own() -> None:
    memo = judge.VerdictMemo()
    stored = _stored(20, unreachable={5}, mtu=1500)
    one = frozenset({stored[0]["node_ip"]})
    assert _memo_blockers(memo, stored, one, 1450) == []  # node 0 reachable, 1500 carries 1450
    too_big = _memo_blockers(memo, stored, one, 9000)
    assert [b.kind for b in too_big] == _afresh_kinds(stored, one, 9000) != []
    five = frozenset({stored[5]["node_ip"]})
    assert [b.fqdn for b in _memo_blockers(memo, stored, five, 1450)] == ["n5"]
    # The returned list is the caller's: changing it does not change the next answer.
    got = _memo_blockers(memo, stored, five, 1450)
    got.clear()
    assert [b.fqdn for b in _memo_blockers(memo, stored, five, 1450)] == ["n5"]


def _afresh_kinds(stored, targets, mtu) -> list[str]:
    return [b.kind for b in _afresh(stored, targets, mtu)]
