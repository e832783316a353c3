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


def candidates_per_vendor(limits: Limits) -> int:
    """How many of each vendor's oldest queued jobs an admission round needs to see: :func:`plan`
    admits a vendor's jobs oldest first and never more than its limit, so a job behind that many
    of its own vendor waits whatever the others do. The round reads those (at most this many per
    vendor) instead of the whole queue: its cost stays flat in the queue's length (a storm of
    10,000 queued jobs read them all at every admission)."""
    return max([limits.per_vendor, *limits.vendors.values()])


def oldest_per_vendor(queued: Sequence[Waiting], n: int) -> list[Waiting]:
    """`queued` (oldest first) keeping each vendor's `n` oldest: what the repository's bounded
    read returns (the rule the property test holds it to)."""
    seen: Counter[str] = Counter()
    out = []
    for w in queued:
        seen[w.vendor] += 1
        if seen[w.vendor] <= n:
            out.append(w)
    return out
