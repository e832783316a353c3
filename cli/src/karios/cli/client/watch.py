"""Live progress of provisions and fabric applies from the gateway's SSE stream.

A terminal gets progress bars (one per host or node, with stage and elapsed time); anything else
(a pipe, a CI log) gets one line per change. Both end with a summary table. The exit code says
how it ended: 0 completed (or ``--until`` reached), 1 failed or cancelled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from karios.cli.client.api import Api
from karios.cli.client.sse import stream

#: The provision state machine's order (karios.provisioner.statemachine), for ``--until``.
STATE_ORDER = ("queued", "building_media", "mounting", "booting", "installing", "first_boot", "completed")
FAILED = frozenset({"failed", "cancelled"})


def reached(state: str, until: str) -> bool:
    if state not in STATE_ORDER or until not in STATE_ORDER:
        return False
    return STATE_ORDER.index(state) >= STATE_ORDER.index(until)


@dataclass
class JobLine:
    job_id: str
    bmc_ip: str = ""
    state: str = "queued"
    status: str = "running"
    stage: str = ""
    percent: int = 0
    message: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def finished(self, until: str | None) -> bool:
        return self.status in ("completed", *FAILED) or bool(until and reached(self.state, until))

    def update(self, data: dict[str, Any], until: str | None) -> bool:
        before = (self.state, self.status, self.stage, self.percent)
        self.bmc_ip = str(data.get("bmc_ip") or self.bmc_ip)
        self.state = str(data.get("state") or data.get("job_status") or self.state)
        self.status = str(data.get("status") or self.status)
        self.stage = str(data.get("stage") or self.stage)
        pct = data.get("percent", data.get("progress"))
        self.percent = int(pct) if isinstance(pct, int) else self.percent
        self.message = str(data.get("message") or self.message)
        if self.finished(until) and self.ended is None:
            self.ended = time.monotonic()
        return before != (self.state, self.status, self.stage, self.percent)

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started


def job_table(lines: list[JobLine]) -> Table:
    t = Table(title="jobs")
    for col in ("job", "bmc", "state", "status", "%", "elapsed", "message"):
        t.add_column(col)
    for j in lines:
        t.add_row(j.job_id, j.bmc_ip, j.state, j.status, str(j.percent), f"{j.elapsed:.1f}s", j.message[:60])
    return t


def watch_jobs(api: Api, job_ids: list[str], console: Console, *, until: str | None = None) -> int:
    lines = {jid: JobLine(jid) for jid in job_ids}
    live = console.is_terminal
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[stage]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not live,
    )
    tasks = {jid: progress.add_task(jid, total=100, stage="") for jid in job_ids}

    printed: dict[str, tuple[str, str, str, int]] = {}

    def show(j: JobLine) -> None:
        desc = f"{j.bmc_ip or j.job_id:<16} {j.state:<14}"
        progress.update(
            tasks[j.job_id], description=desc, completed=j.percent, stage=j.stage or j.message[:40]
        )
        sig = (j.state, j.status, j.stage or j.message, j.percent)  # what the line shows
        if not live and printed.get(j.job_id) != sig:
            printed[j.job_id] = sig
            console.print(
                f"{time.strftime('%H:%M:%S')} {j.bmc_ip:<16} {j.state:<14} {j.status:<9} "
                f"{j.percent:>3}% {j.elapsed:6.1f}s {j.stage or j.message}",
                highlight=False,
            )

    def refresh() -> None:
        for jid, j in lines.items():
            if j.update(api.get(f"/controlnode/job/{jid}"), until) or not live:
                show(j)

    def all_done() -> bool:
        return all(j.finished(until) for j in lines.values())

    with progress:
        for ev in stream(api, [f"job:{j}" for j in job_ids], on_connect=refresh, stop=all_done):
            data = ev.payload
            j = lines.get(str(data.get("job_id", "")))
            if j is not None and not j.finished(until) and j.update(data, until):
                show(j)
    console.print(job_table(list(lines.values())))
    return 1 if any(j.status in FAILED or j.state in FAILED for j in lines.values()) else 0


def node_table(view: dict[str, Any]) -> Table:
    t = Table(
        title=f"fabric {view.get('job_type', '')} {view.get('job_id', '')}: {view.get('job_status', '')}"
    )
    for col in ("node", "fqdn", "result", "changed", "vtep", "error"):
        t.add_column(col)
    for n in view.get("nodes") or []:
        result = "ok" if n.get("ok") else ("rolled back" if n.get("rolled_back") else "failed")
        if not n.get("reachable", True):
            result = "unreachable"
        t.add_row(
            n.get("node_ip", ""),
            n.get("fqdn", ""),
            result,
            "yes" if n.get("changed") else "no",
            n.get("vtep_ip", ""),
            (n.get("error") or "")[:60],
        )
    return t


def watch_fabric(api: Api, job_id: str, console: Console) -> int:
    """Follow a fabric apply/teardown until its job ends (``/fabric-config/latest`` per change)."""
    state: dict[str, Any] = {"view": {}, "polled": 0.0, "printed": ""}
    live = console.is_terminal
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        disable=not live,
    )
    task = progress.add_task(f"fabric {job_id}", total=100)

    def poll(force: bool = False) -> None:
        if not force and time.monotonic() - state["polled"] < 0.5:
            return
        state["polled"] = time.monotonic()
        view = api.get("/controlnode/fabric-config/latest") or {}
        if view.get("job_id") != job_id:
            return
        state["view"] = view
        desc = (
            f"fabric {view.get('state') or view.get('job_status')}: "
            f"{view.get('completed_nodes', 0)}/{view.get('total_nodes', 0)} nodes"
        )
        progress.update(task, description=desc, completed=int(view.get("progress") or 0))
        line = f"{desc} ({view.get('progress', 0)}%)"
        if not live and line != state["printed"]:
            console.print(f"{time.strftime('%H:%M:%S')} {line}", highlight=False)
            state["printed"] = line

    def done() -> bool:
        poll()
        return bool(state["view"]) and state["view"].get("job_status") != "running"

    with progress:
        for _ev in stream(api, [f"job:{job_id}", "fabric"], on_connect=lambda: poll(True), stop=done):
            poll(True)
            if done():
                break
    view = state["view"]
    console.print(node_table(view))
    if view.get("first_fail_error"):
        console.print(f"first failure: {view.get('first_fail_node')}: {view.get('first_fail_error')}")
    return 0 if view.get("job_status") == "completed" else 1
