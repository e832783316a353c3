"""FRR's running configuration against the rendered ``frr.conf`` (pure).

The file on disk can equal the rendered one while the daemons run something else: a
``vtysh -c 'conf t' -c 'router bgp …' -c 'neighbor X shutdown'`` changes only the running
configuration. The apply's discovery therefore prints ``show running-config`` and this module
says how it differs from the rendered file, so the apply repairs it (:mod:`.node_steps`).

Both texts are reduced to a set of lines, each qualified by the section lines above it (by
indentation, as FRR prints and the template renders them): order, ``!``/``exit`` lines and
repeated blanks do not count. FRR prints some lines of its own that no config file holds
(:data:`FRR_OWN`) and leaves out a line whose value is its default (:data:`FRR_HIDES_DEFAULTS`,
measured on FRR 8.4 with every template variant — ``tests/unit/fabric_rollout/test_running.py``):
such a line missing from the running config is not a difference, the daemon runs that value.
Everything else is: a line the running config has and the file does not (``neighbor X shutdown``
typed by hand) is *added*, a rendered line the daemons do not run (``no advertise-all-vni``) is
*missing*.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from karios.fabric_worker.rollout.diff import link_changes, redact_text
from karios.fabric_worker.rollout.facts import NodeFacts
from karios.fabric_worker.rollout.plan import FrrAction, FrrPlan

Line = tuple[str, ...]  # the section lines above it, then the line itself

# Lines FRR prints that are not configuration a file sets: its banner, the version, the
# kernel's forwarding state as zebra reads it (not in the rendered file, not Karios's).
FRR_OWN = re.compile(
    r"^(?:Building configuration\.\.\.|Current configuration:|end|frr version .*"
    r"|(?:no )?ip(?:v6)? forwarding)$"
)
_STRUCTURE = frozenset({"exit", "exit-address-family", "exit-vrf", "exit-vnc", "quit"})
# Rendered lines FRR leaves out of `show running-config` when they hold its default value.
FRR_HIDES_DEFAULTS = frozenset(
    {
        "ip ospf network broadcast",
        "ip ospf hello-interval 10",
        "ip ospf dead-interval 40",
        "auto-cost reference-bandwidth 100000",
        "detect-multiplier 3",
        "receive-interval 300",
        "transmit-interval 300",
    }
)
SHOWN = 4  # lines a message names before "… and N more"


def config_lines(text: str) -> set[Line]:
    """`text` (a config file or ``show running-config``) as context-qualified lines."""
    out: set[Line] = set()
    stack: list[str] = []
    for raw in text.splitlines():
        body = " ".join(raw.split())
        if not body or body.startswith("!") or body in _STRUCTURE or FRR_OWN.match(body):
            continue
        depth = len(raw) - len(raw.lstrip(" "))
        del stack[depth:]
        out.add((*stack, body))
        stack.append(body)
    return out


def _tops(lines: set[Line]) -> list[Line]:
    """The lines whose section is not itself in `lines` (a whole section counts once)."""
    return sorted(ln for ln in lines if not any(ln[:i] in lines for i in range(1, len(ln))))


@dataclasses.dataclass(frozen=True)
class RunningDiff:
    """How the running configuration differs from the rendered file (empty: it does not)."""

    added: tuple[Line, ...] = ()  # run by the daemons, not in the file
    missing: tuple[Line, ...] = ()  # in the file, not run (defaults FRR hides excluded)

    def __bool__(self) -> bool:
        return bool(self.added or self.missing)

    def describe(self, secrets: Iterable[str] = ()) -> str:
        """One line for an event: ``neighbor 198.18.0.1 shutdown (added by hand), …``; secret
        values (the intent's, and any after FRR's secret keywords) never appear."""
        items = [f"{ln[-1]} (added by hand)" for ln in self.added] + [
            f"{' › '.join(ln[-2:]) if len(ln) > 1 else ln[0]} (missing)" for ln in self.missing
        ]
        more = f", … and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
        return redact_text(", ".join(items[:SHOWN]) + more, list(secrets))

    def message(self, secrets: Iterable[str] = ()) -> str:
        """What the apply says it repaired ('' when nothing differs)."""
        return f"running config differed: {self.describe(secrets)} → reloaded" if self else ""


def running_diff(rendered: str, running: str) -> RunningDiff:
    """The differences that matter between the rendered ``frr.conf`` and the running config."""
    want, have = config_lines(rendered), config_lines(running)
    missing = {ln for ln in want - have if ln[-1] not in FRR_HIDES_DEFAULTS}
    return RunningDiff(added=tuple(_tops(have - want)), missing=tuple(_tops(missing)))


def repair_plan(plan: FrrPlan, stale: RunningDiff) -> FrrPlan:
    """`plan`, reloading FRR from the files when they are right but the running config is not
    (``frrinit.sh reload`` = ``frr-reload.py --reload`` with the rendered file: only the
    difference is applied; :func:`.node_steps.converge_after_reload` restarts when it did not take)."""
    if stale and plan.action is FrrAction.NONE:
        return dataclasses.replace(plan, action=FrrAction.RELOAD)
    return plan


def devices_differ(cmds: list[str], facts: NodeFacts) -> str:
    """The ``ip`` commands of an apply as what it repairs: ``devices differed: vtep0 missing;
    br100 mtu 9000 → 8950 → restored`` ('' without commands)."""
    if not cmds:
        return ""
    by_dev: dict[str, list[str]] = {}
    for c in link_changes(cmds, facts):
        by_dev.setdefault(c.device, []).append(c.detail if c.action == "mtu" else c.action)
    parts = [
        f"{dev} missing" if "create" in acts and dev not in facts.interfaces else f"{dev} {', '.join(acts)}"
        for dev, acts in by_dev.items()
    ]
    return f"devices differed: {'; '.join(parts)} → restored"


def repairs(
    plan: FrrPlan, net: list[str], facts: NodeFacts, stale: RunningDiff, secrets: Iterable[str]
) -> list[str]:
    """What an apply repairs although the files on disk equal the rendered ones (none when it
    writes a file: that is a change of the intent, not a repair)."""
    if plan.writes:
        return []
    stopped = plan.action is FrrAction.START and facts.frr_installed and any(facts.files.values())
    return [
        m
        for m in (
            "FRR was not running → started" if stopped else "",
            devices_differ(net, facts),
            stale.message(secrets),
        )
        if m
    ]
