"""Apply preview (pure): a node's FRR plan and ``ip`` commands as what an operator reads —
unified diffs of the managed files made from redacted copies, and the link changes classified.

Nothing here sees a node: :mod:`.preview` gathers the facts and the plan (the apply's own
``frr_plan`` / ``network_commands``) and hands them over.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterable

from karios.common.contracts.fabric_diff import REDACTED, FileDiff, LinkChange
from karios.fabric_worker.config.pool import VtepPool
from karios.fabric_worker.rollout.facts import MANAGED_FILES, NodeFacts
from karios.fabric_worker.rollout.plan import VTEP_CREATE, FrrPlan

SECRET_ONLY = "# only secret values differ (not shown)\n"  # noqa: S105 (a note, not a secret)

# FRR syntax that carries a secret: whatever follows the keyword is redacted, so a key on the
# node that is not the intent's (an old one, one typed by hand) never shows either.
_SECRET_SYNTAX = re.compile(
    r"(?P<kw>\b(?:password|key-string|authentication-key)\s+|\bmessage-digest-key\s+\d+\s+md5\s+)\S+"
)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """`text` with every known secret value and every value after a secret keyword replaced."""
    for value in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return _SECRET_SYNTAX.sub(lambda m: m.group("kw") + REDACTED, text)


def file_diffs(facts: NodeFacts, plan: FrrPlan, secrets: Iterable[str]) -> list[FileDiff]:
    """One :class:`FileDiff` per file the plan writes or deletes, in the managed-file order."""
    secret_list = list(secrets)
    out = []
    for name in MANAGED_FILES:
        if name not in plan.writes:
            continue
        have, want = facts.files.get(name), plan.writes[name]
        change = "create" if have is None else "delete" if want is None else "modify"
        a, b = redact_text(have or "", secret_list), redact_text(want or "", secret_list)
        text = "".join(
            difflib.unified_diff(
                _lines(a),
                _lines(b),
                fromfile="/dev/null" if have is None else f"a/etc/frr/{name}",
                tofile="/dev/null" if want is None else f"b/etc/frr/{name}",
            )
        )
        out.append(FileDiff(name=name, change=change, diff=text or SECRET_ONLY))
    return out


def _lines(text: str) -> list[str]:
    """Lines with their newline (a last line without one gets it: the diff stays line-based)."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def _mtu(facts: NodeFacts, dev: str) -> str:
    iface = facts.interfaces.get(dev)
    return f"{iface.mtu} → " if iface is not None else ""


def link_change(cmd: str, facts: NodeFacts) -> LinkChange:
    """Classify one command of :func:`plan.network_commands` (``facts``: the node before)."""
    if cmd == VTEP_CREATE:
        return LinkChange(device="vtep0", action="create", detail="dummy (veth pair without it)", command=cmd)
    w = shlex.split(cmd)
    if w[:4] == ["ip", "-4", "addr", "flush"]:
        return LinkChange(device=w[-1], action="flush", detail="remove its IPv4 addresses", command=cmd)
    if w[:3] == ["ip", "addr", "add"]:
        return LinkChange(device=w[-1], action="address", detail=w[3], command=cmd)
    if w[:3] == ["ip", "link", "del"]:
        return LinkChange(device=w[3], action="delete", command=cmd)
    if w[:3] == ["ip", "link", "add"]:
        dev, opts = w[3], dict(zip(w[4::2], w[5::2], strict=False))
        kind = opts.get("type", "")
        detail = f"{kind} mtu {opts.get('mtu', '?')}"
        if kind == "vxlan":
            detail += f", VNI {w[w.index('id') + 1]}, local {w[w.index('local') + 1]}"
        return LinkChange(device=dev, action="create", detail=detail, command=cmd)
    if w[:3] == ["ip", "link", "set"] and len(w) >= 5:
        dev, what = w[3], w[4]
        if what == "mtu":
            return LinkChange(device=dev, action="mtu", detail=f"mtu {_mtu(facts, dev)}{w[5]}", command=cmd)
        if what == "master":
            return LinkChange(device=dev, action="master", detail=f"in {w[5]}", command=cmd)
        if what == "up":
            return LinkChange(device=dev, action="up", detail="set up", command=cmd)
    raise ValueError(f"unclassified link command: {cmd}")


def link_changes(cmds: list[str], facts: NodeFacts) -> list[LinkChange]:
    return [link_change(c, facts) for c in cmds]


def planned_vteps(pool: VtepPool, allocated: dict[str, str], node_ips: list[str]) -> dict[str, str]:
    """The VTEP address each node would have after an apply's allocation (same rule as
    ``config.store.allocate``, in the same order, nothing written): its own when the pool
    holds it, else the lowest free one. A node the full pool has no room for maps to ''."""
    taken = {ip for node, ip in allocated.items() if pool.contains(ip)}
    out = {}
    for node in node_ips:
        own = allocated.get(node)
        if own is not None and pool.contains(own):
            out[node] = own
            continue
        free = pool.first_free(taken) or ""
        if free:
            taken.add(free)
        out[node] = free
    return out
