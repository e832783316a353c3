"""What Karios created on a node, so that a teardown removes that and nothing else (issue 23
item 9). Pure: facts in, the record / the teardown's commands out.

**Where it is recorded: on the node**, in ``/etc/frr/.karios-created.json`` (``facts.RECORD_PATH``),
written by the apply's commit — in the same SSH exec, after the changes it describes — and read
by the same discovery that reads the FRR files. Why the node and not ``fabric.node_baselines``
(those rows live only while a job runs) or a new per-node table:

- the record has the lifetime of what it describes: a reinstalled node has neither the record nor
  Karios's devices, while a database row would outlive the reinstall and claim the operator's new
  devices; a node restored from a backup of /etc brings the record with the files it names;
- change and record cannot disagree across a crash: one exec writes both, and a rollback restores
  the record with the baseline's files (the baseline carries it), where a database row would be a
  second transaction that a worker dying in between leaves wrong;
- a teardown needs nothing but the node: the whole-fabric teardown runs after the config row is
  deleted, and a node torn down by hand is readable by its operator (``cat`` the file; removing
  a device's name from it hands the device over to the operator);
- /etc/frr, not /var/lib/karios: it is per FRR instance like the files it names (the lab's
  namespaces and containers share /var/lib but not /etc/frr).

**Reboots.** The devices are made with ``ip link`` and do not survive a reboot, the files do. So
the record carries the kernel's boot id, and its device list counts only in that boot: a device of
the same name found after a reboot (made by ifupdown, say) was not made by Karios. The next apply
creates its devices again and records them under the new boot id.

**What counts as Karios's.** A device is recorded when an apply creates it (it did not exist
before that apply); it stays Karios's on later applies, and leaves the record when an apply removes
it. A device that existed before Karios's first apply — ``br100`` made by hand, say — is the
operator's even when Karios uses it, and survives the teardown. A managed FRR file is recorded
with what was there before Karios first wrote it: ``null`` (absent: teardown removes it) or the
operator's original text (teardown puts it back and, when FRR ran before Karios's first apply,
restarts FRR on it instead of stopping it).

**Nodes without a record** (applied by an older version, or a corrupt record): Karios's devices are
those with its exact names carrying a VNI of the intent (``vxlanN`` of type vxlan with VNI N,
``brN`` a bridge holding that ``vxlanN``, for N in the VNI list; ``vtep0`` a dummy or veth), and
only when ``frr.conf`` or ``daemons`` still carries Karios's header; its files are the managed
files present. Nothing else, ever: without the header nothing on the node is Karios's. The first
apply of this version on such a node writes the record from that rule.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence

from karios.fabric_worker.rollout.facts import MANAGED_FILES, RECORD_NAME, RECORD_PATH, Interface, NodeFacts
from karios.fabric_worker.rollout.plan import FrrAction, FrrPlan

MARKER = "Managed by Karios fabric rollout"  # first line of the rendered frr.conf and daemons
RECORD_VERSION = 1
_NAMED = re.compile(r"(vxlan|br)([0-9]+)")
_KIND = {"vxlan": ("vxlan",), "br": ("bridge",)}
_VTEP_KINDS = ("dummy", "veth")


@dataclasses.dataclass(frozen=True)
class Ownership:
    """What Karios owns on a node right now."""

    devices: frozenset[str] = frozenset()
    # Managed files Karios wrote: None = absent before (Karios's), else the operator's original.
    files: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    frr_was_running: bool = False  # some FRR daemon ran before Karios's first apply
    source: str = "none"  # "record" | "legacy" (no record: the name + VNI rule) | "none"


def karios_named(name: str) -> bool:
    """vtep0, vxlanN, brN: the only names Karios ever creates (or deletes)."""
    return name == "vtep0" or _NAMED.fullmatch(name) is not None


def device_names(vnis: Iterable[int]) -> frozenset[str]:
    """The devices an apply of `vnis` makes exist."""
    return frozenset({"vtep0"} | {f"{p}{v}" for v in vnis for p in ("vxlan", "br")})


def _fits(iface: Interface) -> bool:
    """The device still is of the kind Karios made under that name."""
    if iface.name == "vtep0":
        return iface.kind in _VTEP_KINDS
    m = _NAMED.fullmatch(iface.name)
    return m is not None and iface.kind in _KIND[m[1]]


def read_record(facts: NodeFacts) -> Ownership | None:
    """The node's record; None when absent or unreadable (then the legacy rule applies)."""
    if facts.record is None:
        return None
    try:
        data = json.loads(facts.record)
        if data.get("version") != RECORD_VERSION:
            return None
        devices = frozenset(str(d) for d in data.get("devices") or [] if karios_named(str(d)))
        files = {
            str(k): v
            for k, v in (data.get("files") or {}).items()
            if k in MANAGED_FILES and (v is None or isinstance(v, str))
        }
        same_boot = str(data.get("boot_id") or "") == facts.boot_id
    except (ValueError, TypeError, AttributeError):
        return None
    return Ownership(
        devices=devices if same_boot else frozenset(),
        files=files,
        frr_was_running=bool(data.get("frr_was_running")),
        source="record",
    )


def karios_marked(facts: NodeFacts) -> bool:
    return any(MARKER in (facts.files.get(n) or "") for n in ("frr.conf", "daemons"))


def legacy_ownership(facts: NodeFacts, vnis: Iterable[int]) -> Ownership:
    """A node without a record: Karios's exact names carrying the intent's VNIs, only on a node
    whose FRR files carry Karios's header (see the module docstring)."""
    if not karios_marked(facts):
        return Ownership()
    ifs = facts.interfaces
    devices = {"vtep0"} if "vtep0" in ifs and _fits(ifs["vtep0"]) else set()
    for v in vnis:
        vx, br = ifs.get(f"vxlan{v}"), ifs.get(f"br{v}")
        if vx is not None and vx.kind == "vxlan" and vx.vxlan_id == v:
            devices.add(vx.name)
            if br is not None and br.kind == "bridge" and vx.master == br.name:
                devices.add(br.name)
    files = {n: None for n in MANAGED_FILES if facts.files.get(n) is not None}
    return Ownership(devices=frozenset(devices), files=files, source="legacy")


def ownership(facts: NodeFacts, vnis: Iterable[int]) -> Ownership:
    """What Karios owns on the node: its record, else the legacy rule."""
    rec = read_record(facts)
    return rec if rec is not None else legacy_ownership(facts, vnis)


def foreign_devices(facts: NodeFacts, vnis: Iterable[int]) -> frozenset[str]:
    """The node's devices that are not Karios's: an apply never removes them as unwanted."""
    return frozenset(facts.interfaces) - ownership(facts, vnis).devices


# -- apply: the record the commit writes ------------------------------------------------------


def record_after_apply(
    before: NodeFacts, vnis: Sequence[int], net: Sequence[str], writes: Iterable[str]
) -> str:
    """The record a commit of `net` (link commands) and `writes` (managed files) leaves, on a
    node that looked like `before` when the apply started."""
    prev = ownership(before, vnis)
    present = frozenset(before.interfaces)
    deleted = {c.split()[3] for c in net if c.startswith("ip link del ")}
    after = device_names(vnis) | (present - deleted)
    devices = sorted(n for n in after if n in prev.devices or n not in present)
    files = dict(prev.files)
    for name in writes:
        files.setdefault(name, before.files.get(name))
    was_running = prev.frr_was_running if prev.source != "none" else bool(before.frr_pids)
    return (
        json.dumps(
            {
                "version": RECORD_VERSION,
                "note": "What the Karios fabric apply created on this node; its teardown removes "
                "only these devices and files (null: created by Karios; text: the original, put back).",
                "boot_id": before.boot_id,
                "devices": devices,
                "files": {n: files[n] for n in MANAGED_FILES if n in files},
                "frr_was_running": was_running,
            },
            indent=1,
        )
        + "\n"
    )


def with_record(plan: FrrPlan, before: NodeFacts, vnis: Sequence[int], net: Sequence[str]) -> FrrPlan:
    """`plan` writing the node's record with its commit."""
    record = record_after_apply(before, vnis, net, plan.writes)
    return dataclasses.replace(plan, state={**plan.state, RECORD_NAME: record})


# -- teardown ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TeardownPlan:
    frr: FrrPlan  # files removed / put back, FRR stopped (or restarted on the operator's config)
    net: tuple[str, ...]  # Karios's devices removed, then the record (last: a failure keeps it)
    steps: tuple[str, ...]
    kept: tuple[str, ...]  # devices with Karios's names that are not Karios's
    source: str  # where the ownership came from: record | legacy | none


def _order(name: str) -> tuple[int, int, bool, str]:
    m = _NAMED.fullmatch(name)
    return (1, 0, False, name) if m is None else (0, int(m[2]), m[1] == "br", name)


def teardown_plan(facts: NodeFacts, vnis: Iterable[int]) -> TeardownPlan:
    """Remove what Karios created on the node (`vnis`: the legacy rule's VNIs) and nothing else."""
    own = ownership(facts, vnis)
    ifs = facts.interfaces
    doomed = sorted((n for n in own.devices if n in ifs and _fits(ifs[n])), key=_order)
    writes = {n: orig for n, orig in own.files.items() if facts.files.get(n) != orig}
    restored = any(orig is not None for orig in own.files.values())
    running = bool(facts.frr_pids)
    if not own.files:
        action = FrrAction.NONE  # Karios wrote no FRR file here: its FRR is not Karios's to stop
    elif own.frr_was_running and restored:
        action = FrrAction.RESTART if running else FrrAction.NONE
    else:
        action = FrrAction.STOP if running else FrrAction.NONE
    steps = ["frr_stopped"] if action is FrrAction.STOP else []
    if any(v is None for v in writes.values()):
        steps.append("frr_config_removed")
    if any(v is not None for v in writes.values()):
        steps.append("frr_config_restored")
    steps += [f"{n}_removed" for n in doomed]
    if action is FrrAction.RESTART:
        steps.append("frr_restarted")
    net = [f"ip link del {n}" for n in doomed]
    if facts.record is not None:
        net.append(f"rm -f {RECORD_PATH}")
    kept = sorted((n for n in ifs if karios_named(n) and n not in doomed), key=_order)
    return TeardownPlan(FrrPlan(writes, action), tuple(net), tuple(steps), tuple(kept), own.source)


def teardown_message(plan: TeardownPlan) -> str:
    msg = "fabric removed from node" if plan.steps else "nothing was configured"
    if plan.steps and plan.source == "legacy":
        msg += " (no record of what Karios created: its devices by name and VNI)"
    if plan.kept:
        msg += f"; kept {', '.join(plan.kept)} (not created by Karios)"
    return msg
