"""Live progress of provisions and fabric applies from the gateway's SSE stream.

A terminal gets progress bars (one per host or node, with stage and elapsed time); anything else
(a pipe, a CI log) gets one line per change. Both end with a summary table. The exit code says
how it ended: 0 completed (or ``--until`` reached), 1 failed or cancelled.

A watch that ends on an event returns only once the gateway's job view agrees with it
(:func:`settle`): the view is the read model, which the gateway's projector writes a moment after
the event is on the stream, and ``karios provision --watch && karios job show …`` must not read
"running" after the watch said "completed".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from karios.cli.client.api import Api
from karios.cli.client.errors import CliError
from karios.cli.client.shared import SHORT_ID, print_table, show_id
from karios.cli.client.sse import stream

#: The provision state machine's order (karios.provisioner.statemachine), for ``--until``.
STATE_ORDER = ("queued", "building_media", "mounting", "booting", "installing", "first_boot", "completed")
FAILED = frozenset({"failed", "cancelled"})
#: Where a job ends (``stuck`` does not: the job comes back when the installer reports again).
ENDED = frozenset({"completed", "failed", "cancelled"})
#: How long a watch that saw its job end waits for the job view to say so too (the read model
#: follows the stream by milliseconds; seconds only after a gateway restart or in a storm).
SETTLE_SECONDS = 15.0


def check_until(until: str | None) -> str | None:
    """``--until`` must name a state the job passes through (else it would wait forever)."""
    if until and until not in STATE_ORDER:
        raise CliError(f"--until {until!r} is not a job state; one of: {', '.join(STATE_ORDER)}", 2)
    return until or None


def reached(state: str, until: str) -> bool:
    if state not in STATE_ORDER or until not in STATE_ORDER:
        return False
    return STATE_ORDER.index(state) >= STATE_ORDER.index(until)


def _epoch(value: Any) -> float | None:
    """An ISO 8601 time (the gateway's ``created_at``, an event's ``time``) as a Unix time."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo else None


@dataclass
class JobLine:
    job_id: str
    bmc_ip: str = ""
    state: str = "queued"
    status: str = "running"
    stage: str = ""
    percent: int = 0
    message: str = ""
    #: Unix times: the job's own creation (the gateway's ``created_at``) and end.
    started: float = field(default_factory=time.time)
    ended: float | None = None

    def finished(self, until: str | None) -> bool:
        return self.status in ENDED or bool(until and reached(self.state, until))

    @property
    def failed(self) -> bool:
        return self.status in FAILED or self.state in FAILED

    @property
    def troubled(self) -> bool:
        """Failed, cancelled or stuck: a line then says why."""
        return self.failed or "stuck" in (self.status, self.state)

    def update(self, data: dict[str, Any], until: str | None, at: Any = None) -> bool:
        """Apply a job view or event; `at` is the event's time. True if what a line shows changed."""
        before = (self.state, self.status, self.stage, self.percent, self.message)
        self.bmc_ip = str(data.get("bmc_ip") or self.bmc_ip)
        self.state = str(data.get("state") or data.get("job_status") or self.state)
        self.status = str(data.get("status") or self.status)
        self.stage = str(data.get("stage") or self.stage)
        pct = data.get("percent", data.get("progress"))
        self.percent = int(pct) if isinstance(pct, int) else self.percent
        self.message = str(data.get("message") or self.message)
        created = _epoch(data.get("created_at"))
        if created is not None:
            self.started = created
        if self.finished(until) and self.ended is None:
            end = _epoch(data.get("updated_at")) if self.status in ENDED else None
            self.ended = max(end or _epoch(at) or time.time(), self.started)
        return before != (self.state, self.status, self.stage, self.percent, self.message)

    @property
    def elapsed(self) -> float:
        """Seconds since the job itself started (not since this watch did)."""
        return max(0.0, (self.ended or time.time()) - self.started)

    @property
    def detail(self) -> str:
        """What a line says: the stage, and on a failure the reason (never only "Failed"); while
        installing, the installer's step ("Partitioning disks: …"), not only "Installing OS"."""
        if self.troubled and self.message and self.message not in self.stage:
            return f"{self.stage}: {self.message}" if self.stage else self.message
        if self.state == "installing" and self.message:
            return self.message
        return self.stage or self.message


class JobElapsed(ProgressColumn):
    """Elapsed time of the job a progress row shows, from the job's own start."""

    def render(self, task: Task) -> Text:
        line = task.fields.get("line")
        secs = int(line.elapsed) if isinstance(line, JobLine) else 0
        return Text(f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}", style="progress.elapsed")


def job_table(lines: list[JobLine], con: Console | None = None) -> Table:
    t = Table(title="jobs")
    for col in ("job", "bmc", "state", "status", "%", "elapsed"):
        t.add_column(col, no_wrap=True, min_width=SHORT_ID if col == "job" else None)
    t.add_column("message", overflow="fold")  # the failure reason wraps, never cut
    for j in lines:
        t.add_row(
            show_id(j.job_id, con),
            j.bmc_ip,
            j.state,
            j.status,
            str(j.percent),
            f"{j.elapsed:.1f}s",
            j.message,
        )
    return t


def agrees(view: dict[str, Any], line: JobLine, until: str | None) -> bool:
    """Whether a job view says what the watch saw: the same end, or (``--until``) that state or
    a later one — or an end, which is past every state."""
    status = str(view.get("status") or "")
    if line.status in ENDED:
        return status == line.status
    state = str(view.get("job_status") or view.get("state") or "")
    return status in ENDED or bool(until and reached(state, until))


def settle(
    api: Api, lines: list[JobLine], console: Console, until: str | None, timeout: float = SETTLE_SECONDS
) -> None:
    """Read each finished line's job view until it agrees with the event the watch ended on
    (every 0.1 s, then slower, for at most `timeout` s in all). A view that never agrees is
    said on the console, naming the job; the watch's outcome stays the event's."""
    deadline = time.monotonic() + timeout
    pause = 0.1
    waiting = [j for j in lines if j.finished(until)]

    def view(j: JobLine) -> dict[str, Any]:
        try:
            return api.get(f"/controlnode/job/{j.job_id}")
        except CliError:
            return {}  # not readable this moment (a gateway restarting): read again

    while waiting:
        waiting = [j for j in waiting if not agrees(view(j), j, until)]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 1.0)
    for j in waiting:
        said = j.status if j.status in ENDED else until
        console.print(
            f"job {j.job_id}: the gateway's job view does not say {said!r} yet, {timeout:.0f} s after "
            f"the event did ('karios job show {j.job_id}' will once it has caught up)",
            highlight=False,
            soft_wrap=True,
        )


def watch_jobs(
    api: Api,
    job_ids: list[str],
    console: Console,
    *,
    until: str | None = None,
    follow_new: bool = False,
    settle_timeout: float = SETTLE_SECONDS,
) -> int:
    """Follow `job_ids` until each ends (or reaches `until`); exit code 0, or 1 if one failed.
    `follow_new` (``karios jobs --watch``): also every job created meanwhile, until Ctrl-C."""
    until = check_until(until)
    lines: dict[str, JobLine] = {}
    live = console.is_terminal
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[stage]}"),
        JobElapsed(),
        console=console,
        disable=not live,
    )
    tasks: dict[str, Any] = {}
    printed: dict[str, tuple[str, str, str, int]] = {}

    def add(jid: str) -> JobLine:
        lines[jid] = JobLine(jid)
        tasks[jid] = progress.add_task(jid, total=100, stage="", line=lines[jid])
        return lines[jid]

    def show(j: JobLine) -> None:
        desc = f"{j.bmc_ip or j.job_id:<16} {j.state:<14}"
        progress.update(tasks[j.job_id], description=desc, completed=j.percent, stage=j.detail)
        sig = (j.state, j.status, j.detail, j.percent)  # what the line shows
        if not live and printed.get(j.job_id) != sig:
            printed[j.job_id] = sig
            ident = f"{j.bmc_ip:<16}" if not follow_new else f"{show_id(j.job_id, console)} {j.bmc_ip:<16}"
            console.print(
                f"{time.strftime('%H:%M:%S')} {ident} {j.state:<14} {j.status:<9} "
                f"{j.percent:>3}% {j.elapsed:6.1f}s {j.detail}",
                highlight=False,
                soft_wrap=True,  # one line per change, as long as the reason: never cut
            )

    def fetch(j: JobLine, at: Any = None) -> None:
        if j.update(api.get(f"/controlnode/job/{j.job_id}"), until, at) or not live:
            show(j)

    def follow(jid: str, at: Any) -> None:
        try:
            view = api.get(f"/controlnode/job/{jid}")
        except CliError as err:
            if err.status == 404:
                return  # not a job the gateway knows (yet): its next event tries again
            raise
        j = add(jid)
        j.update(view, until, at)
        show(j)

    def refresh() -> None:
        for j in list(lines.values()):
            fetch(j)

    def all_done() -> bool:
        return not follow_new and all(j.finished(until) for j in lines.values())

    for jid in job_ids:
        add(jid)
    channels = ["provision"] if follow_new else [f"job:{j}" for j in job_ids]
    try:
        with progress:
            for ev in stream(api, channels, on_connect=refresh, stop=all_done):
                data = ev.payload
                jid = str(data.get("job_id") or "")
                j = lines.get(jid)
                if j is None and follow_new and jid and not str(data.get("job_type", "")).endswith("_batch"):
                    follow(jid, ev.data.get("time"))  # a job created after the watch began
                elif j is not None and not j.finished(until) and j.update(data, until, ev.data.get("time")):
                    show(j)
    except KeyboardInterrupt:
        if not follow_new:
            raise
    if not follow_new:
        settle(api, list(lines.values()), console, until, settle_timeout)
    print_table(job_table(list(lines.values()), console), console)
    return 1 if any(j.failed for j in lines.values()) else 0


def node_table(view: dict[str, Any]) -> Table:
    t = Table(
        title=f"fabric {view.get('job_type', '')} {view.get('job_id', '')}: {view.get('job_status', '')}"
    )
    for col in ("node", "fqdn", "result", "changed", "vtep"):
        t.add_column(col, no_wrap=True)
    t.add_column("error", overflow="fold")  # the reason wraps, never cut
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
            n.get("error") or "",
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
    print_table(node_table(view), console)
    if view.get("first_fail_error"):
        console.print(f"first failure: {view.get('first_fail_node')}: {view.get('first_fail_error')}")
    return 0 if view.get("job_status") == "completed" else 1
