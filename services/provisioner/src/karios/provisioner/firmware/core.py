"""Firmware update rules (pure: no I/O, no clock).

- :func:`plan_update`: from the BMC's ``UpdateService`` document, the vendor's quirks and the
  request, how the image reaches the BMC (``SimpleUpdate`` with ``ImageURI`` and, when the BMC
  lists them, ``TransferProtocol``; or a multipart push) and which apply time is sent — or why the
  BMC cannot do what was asked (:class:`UpdateNotPossible`, the job fails naming it).
- :func:`read_task`: a Task (or task-monitor answer) → state, percent, done/ok, messages.
- :func:`component_results`: the versions before and after → one result per component.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from karios.common.contracts.firmware import ApplyTime, FirmwareComponentResult
from karios.provisioner.drivers.quirks import Quirks

Doc = dict[str, Any]
SIMPLE_UPDATE = "#UpdateService.SimpleUpdate"
#: Our apply time → the Redfish ``OperationApplyTime`` value.
REDFISH_APPLY_TIME: dict[str, str] = {"immediate": "Immediate", "on_reset": "OnReset"}
#: TaskState values (DSP0268 Task) after which a Task does not change.
TASK_FAILED = frozenset({"Exception", "Killed", "Cancelled"})
TASK_DONE = frozenset({"Completed"}) | TASK_FAILED
MAX_MESSAGES = 20


class UpdateNotPossible(Exception):
    """The BMC cannot do the update as asked (the reason names the field or the BMC's limit)."""


@dataclass(frozen=True)
class UpdatePlan:
    method: str  # "simple_update" | "multipart_push"
    target: str  # the action target or the multipart push URI
    body: Doc = field(default_factory=dict)  # SimpleUpdate body, or the multipart UpdateParameters
    apply_time_sent: str = ""  # the Redfish value sent ('' none: the BMC's default, immediate)


def _listed(action: Doc, key: str) -> list[str]:
    values = action.get(f"{key}@Redfish.AllowableValues")
    return [str(v) for v in values] if isinstance(values, list) else []


def supported_apply_times(action_or_service: Doc) -> list[str] | None:
    """``@Redfish.OperationApplyTimeSupport.SupportedValues`` (None: not advertised)."""
    support = action_or_service.get("@Redfish.OperationApplyTimeSupport")
    if not isinstance(support, dict) or not isinstance(support.get("SupportedValues"), list):
        return None
    return [str(v) for v in support["SupportedValues"]]


def _apply_time(wanted: ApplyTime, supported: list[str] | None) -> str:
    """The ``@Redfish.OperationApplyTime`` to send ('' none). ``immediate`` on a BMC that does not
    advertise apply times is its default: nothing is sent. ``on_reset`` needs the BMC to say so."""
    value = REDFISH_APPLY_TIME[wanted]
    if supported is None:
        if wanted == "immediate":
            return ""
        raise UpdateNotPossible(
            "apply_time: the BMC does not advertise @Redfish.OperationApplyTimeSupport, "
            "so on_reset cannot be honoured"
        )
    if value not in supported:
        raise UpdateNotPossible(f"apply_time: the BMC supports {supported}, not {value}")
    return value


def transfer_protocol(image_url: str, allowed: list[str]) -> str:
    """``TransferProtocol`` to send: the URL's scheme upper-cased when the BMC lists allowed values
    (some firmware requires the parameter), '' when it lists none (the scheme is in the URI)."""
    if not allowed:
        return ""
    scheme = urlsplit(image_url).scheme.upper()
    if scheme not in allowed:
        raise UpdateNotPossible(f"image_url: the BMC fetches images by {allowed}, not {scheme}")
    return scheme


def plan_update(
    service: Doc, quirks: Quirks, *, image_url: str, targets: list[str], apply_time: ApplyTime
) -> UpdatePlan:
    """How to update through this ``UpdateService``: SimpleUpdate unless the vendor's quirk says
    multipart, or SimpleUpdate is missing or refuses the targets and a multipart URI exists."""
    actions = service.get("Actions") if isinstance(service.get("Actions"), dict) else {}
    simple = actions.get(SIMPLE_UPDATE) if isinstance(actions.get(SIMPLE_UPDATE), dict) else None
    multipart_uri = str(service.get("MultipartHttpPushUri") or "")
    allowed_targets = _listed(simple, "Targets") if simple else []
    refuses_targets = bool(allowed_targets) and any(t not in allowed_targets for t in targets)
    multipart = bool(multipart_uri) and (
        quirks.firmware_push == "multipart" or simple is None or refuses_targets
    )
    if multipart:
        apply_value = _apply_time(apply_time, supported_apply_times(service))
        params: Doc = {"Targets": list(targets)}
        if apply_value:
            params["@Redfish.OperationApplyTime"] = apply_value
        return UpdatePlan("multipart_push", multipart_uri, params, apply_value)
    if simple is None:
        raise UpdateNotPossible(
            "the BMC's UpdateService offers neither SimpleUpdate nor a multipart push URI"
        )
    if refuses_targets:
        raise UpdateNotPossible(f"targets: SimpleUpdate on this BMC accepts only {allowed_targets}")
    apply_value = _apply_time(apply_time, supported_apply_times(simple))
    body: Doc = {"ImageURI": image_url}
    protocol = transfer_protocol(image_url, _listed(simple, "TransferProtocol"))
    if protocol:
        body["TransferProtocol"] = protocol
    if targets:
        body["Targets"] = list(targets)
    if apply_value:
        body["@Redfish.OperationApplyTime"] = apply_value
    target = str(simple.get("target") or "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate")
    return UpdatePlan("simple_update", target, body, apply_value)


@dataclass(frozen=True)
class TaskReading:
    state: str  # TaskState ('' when the answer carries none)
    percent: int | None
    done: bool
    ok: bool
    messages: list[str]


def message_text(msg: Any) -> str:
    if not isinstance(msg, dict):
        return str(msg)[:300]
    text = str(msg.get("Message") or msg.get("MessageId") or "")
    args = msg.get("MessageArgs")
    if isinstance(args, list):  # "Property %1 is read only." + ["SKU"]
        for i, arg in enumerate(args, start=1):
            text = text.replace(f"%{i}", str(arg))
    severity = str(msg.get("Severity") or msg.get("MessageSeverity") or "")
    return (f"{severity}: {text}" if severity and severity != "OK" else text)[:300]


def read_task(status: int, doc: Doc) -> TaskReading:
    """One poll of a task monitor or Task. DSP0266: a monitor answers 202 while the task runs and
    the operation's own answer when it has ended (a 200/204 without a TaskState: done, ok)."""
    state = str(doc.get("TaskState") or "")
    percent = doc.get("PercentComplete")
    pct = int(percent) if isinstance(percent, int | float) and not isinstance(percent, bool) else None
    raw = doc.get("Messages")
    msgs = [message_text(m) for m in (raw if isinstance(raw, list) else [raw] if raw else [])]
    msgs = [m for m in msgs if m]
    if not state:
        done = status != 202
        return TaskReading("Completed" if done else "", 100 if done else pct, done, done, msgs)
    failed = state in TASK_FAILED or (state == "Completed" and doc.get("TaskStatus") == "Critical")
    done = state in TASK_DONE
    return TaskReading(
        state, 100 if done and not failed and pct is None else pct, done, done and not failed, msgs
    )


def task_percent(reading: TaskReading, last: int) -> int:
    """Progress shown for a running task: the BMC's percent, never going backwards (a BMC restarts
    the count per phase), capped below 100 until the task has ended."""
    if reading.percent is None:
        return last
    pct = max(last, min(100, reading.percent))
    return pct if reading.done else min(pct, 99)


@dataclass(frozen=True)
class VersionSeen:
    id: str
    name: str = ""
    kind: str = "other"
    uri: str = ""
    version: str = ""


def component_results(
    before: dict[str, VersionSeen],
    after: dict[str, VersionSeen],
    targets: list[str],
    *,
    pending_reset: bool = False,
) -> list[FirmwareComponentResult]:
    """Per component: what changed between the two reads. Every target is reported (its version
    unchanged: ``unchanged``, or ``pending_reset`` when the update applies at the next reset); a
    component that is not a target is reported only if it changed. Keyed by URI (else id)."""
    wanted = {t.rstrip("/") for t in targets}
    out: list[FirmwareComponentResult] = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        seen = a or b
        assert seen is not None
        is_target = key.rstrip("/") in wanted or seen.uri.rstrip("/") in wanted
        if b is None:
            outcome = "added"
        elif a is None:
            outcome = "removed"
        elif a.version != b.version:
            outcome = "updated"
        elif is_target:
            outcome = "pending_reset" if pending_reset else "unchanged"
        else:
            continue
        out.append(
            FirmwareComponentResult(
                id=seen.id,
                name=seen.name,
                kind=seen.kind,
                uri=seen.uri,
                version_before=b.version if b else "",
                version_after=a.version if a else "",
                outcome=outcome,  # type: ignore[arg-type]
            )
        )
    return out


def verdict(results: list[FirmwareComponentResult], targets: list[str], *, pending_reset: bool) -> str:
    """'' when the read-back agrees with a successful task, else why not: a target that did not
    change after an immediate update (the BMC said Completed and changed nothing)."""
    if pending_reset or not targets:
        return ""
    stale = [r.id for r in results if r.outcome == "unchanged"]
    if stale:
        return f"the task completed but these targets report the same version: {', '.join(stale)}"
    return ""
