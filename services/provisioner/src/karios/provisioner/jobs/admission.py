"""Admission control, the pure rule: which queued jobs may start their BMC/media work now.

A queued job is *admitted* (``admitted_at`` set) before it touches its BMC; it stays admitted
while in the worker phase (``queued`` → ``building_media`` → ``mounting``: probe, medium, insert,
boot override, the one reset) and frees its slot when it reaches ``booting`` or ends. A boot
storm therefore touches at most ``overall`` BMCs at once, and at most the vendor's limit of one
vendor's BMCs. The queue is walked oldest first; a job that does not fit waits with a reason
(``"overall"`` or ``"vendor:<v>"``) and does not stop a younger job of another vendor that fits.

No I/O: the repository counts the admitted jobs of every replica (under one lock) and asks
:func:`plan`; the queue endpoint asks the same function why each job waits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

OVERALL = "overall"


@dataclass(frozen=True)
class Limits:
    overall: int
    per_vendor: int
    vendors: Mapping[str, int] = field(default_factory=dict)  # per-vendor overrides

    def of(self, vendor: str) -> int:
        return self.vendors.get(vendor, self.per_vendor)


@dataclass(frozen=True)
class Waiting:
    job_id: str
    vendor: str


def plan(limits: Limits, active: Mapping[str, int], queued: Sequence[Waiting]) -> dict[str, str]:
    """Each queued job (oldest first) → ``""`` (admit now) or why it waits.

    ``active``: admitted jobs per vendor, all replicas. Admitting one counts it at once, so the
    answer never goes past a limit whatever the order of the queue.
    """
    total = sum(active.values())
    per = Counter(active)
    out: dict[str, str] = {}
    for w in queued:
        if total >= limits.overall:
            out[w.job_id] = OVERALL
        elif per[w.vendor] >= limits.of(w.vendor):
            out[w.job_id] = f"vendor:{w.vendor}"
        else:
            out[w.job_id] = ""
            total += 1
            per[w.vendor] += 1
    return out
