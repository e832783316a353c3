"""The client verbs (typer): each is one or two gateway calls plus a table, JSON or live progress.

``--output json`` (on the root: ``karios --output json jobs``) prints the gateway's JSON as is, for
scripts; ``-o wide`` full ids on a terminal (a pipe always gets them). ``--context NAME`` picks the
gateway (:mod:`~karios.cli.client.context`). A job is named by its id or a unique prefix
(:func:`resolve_job`). Errors print one ``karios: …`` line and exit non-zero (2 unreachable or a
usage error, 3 auth, 4 busy).
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from karios.cli.client.api import Api, CliError
from karios.cli.client.context import (
    ClientContext,
    context_names,
    load_context,
    named_path,
    save_context,
    selected_name,
)
from karios.cli.client.shared import STATE, App, Watch, api, console, emit, table
from karios.cli.client.sse import stream
from karios.cli.client.watch import STATE_ORDER, watch_jobs

token_app = App(help="API tokens via the gateway: create, rotate, list, revoke (needs fabric_admin)")
job_app = App(help="one job, by its id or a unique prefix of it: show, cancel")
nodes_app = App(help="compute nodes: list (also plain `karios nodes`), adopt, show, remove")
context_app = App(help="client contexts (gateway URL + token) on this machine: list, show")

JobRef = Annotated[
    str, typer.Argument(metavar="JOB", help="a job id, or its first characters (unique among all jobs)")
]
NodeIp = Annotated[str, typer.Argument(metavar="NODE_IP", help="the node's OS (SSH) address")]
TokenName = Annotated[str, typer.Argument(metavar="NAME", help="the token's name")]


def login(
    url: Annotated[str, typer.Argument(metavar="URL", help="the gateway, e.g. http://10.0.0.5:8080")],
    token: Annotated[str, typer.Option(prompt=True, hide_input=True, help="an API token (kt_…)")],
) -> None:
    """Check URL + token against the gateway and keep them in the client context (mode 0600):
    the default one, or the one `karios --context NAME` / KARIOS_CONTEXT names."""
    ctx = ClientContext(url=url.rstrip("/"), token=token)
    with Api(ctx) as a:
        me = a.get("/controlnode/tokens/self")
    ctx.name = me["name"]
    name = selected_name(STATE.get("context"))
    path = save_context(ctx, name=name)
    console.print(f"logged in to {ctx.url} as {me['name']} ({me['role']}); context {name} in {path}")


@context_app.command("list")
def context_list() -> None:
    """The contexts on this machine: name, gateway URL, token name (never the token)."""
    chosen = selected_name(STATE.get("context"))
    rows = []
    for name in context_names():
        try:
            data = json.loads(named_path(name).read_text())
        except (OSError, ValueError):
            data = {}
        rows.append(
            {
                "selected": "*" if name == chosen else "",
                "context": name,
                "url": data.get("url", ""),
                "token_name": data.get("name", ""),
                "file": str(named_path(name)),
            }
        )
    emit(
        rows,
        table("contexts (--context NAME / KARIOS_CONTEXT)", rows, list(rows[0]) if rows else ["context"]),
    )


@context_app.command("show")
def context_show() -> None:
    """The selected context: its name, file and gateway URL (KARIOS_URL/KARIOS_TOKEN applied)."""
    name = selected_name(STATE.get("context"))
    ctx = load_context(name)
    r = {"context": name, "file": str(named_path(name)), "url": ctx.url, "token_name": ctx.name}
    emit(r, table("context", [r], list(r)))


def nodes_list() -> None:
    """The fabric's compute nodes (adopted, registered at first boot, or by BMC with an OS IP)."""
    with api() as a:
        data = a.get("/controlnode/nodes", params={"limit": 1000})
    rows = data.get("items", data) if isinstance(data, dict) else data
    cols = ["node_ip", "hostname", "bmc_ip", "source", "auth", "host_key_fingerprint"]
    emit(data, table("nodes", rows, cols))


@nodes_app.callback(invoke_without_command=True)
def nodes(ctx: typer.Context) -> None:
    """The fabric's compute nodes (adopted, registered at first boot, or by BMC with an OS IP)."""
    if ctx.invoked_subcommand is None:
        nodes_list()


nodes_app.command("list")(nodes_list)


@nodes_app.command("adopt")
def nodes_adopt(
    node_ip: Annotated[str, typer.Argument(metavar="NODE_IP", help="the installed node's OS (SSH) address")],
    user: Annotated[str, typer.Option(help="SSH user (root or passwordless sudo)")] = "root",
    key: Annotated[Path | None, typer.Option(help="an OpenSSH private key file")] = None,
    password_stdin: Annotated[bool, typer.Option(help="read the SSH password from stdin")] = False,
    port: Annotated[int, typer.Option(help="SSH port")] = 22,
    hostname: Annotated[str, typer.Option(help="hostname shown in lists")] = "",
    bmc: Annotated[str, typer.Option(help="its BMC address, if Karios knows it")] = "",
    host_key_fingerprint: Annotated[
        str,
        typer.Option(
            "--host-key-fingerprint",
            metavar="SHA256:…",
            help="the host key the node must present (`ssh-keygen -lf` on the node, or its public key "
            "line); without it the key seen on this first contact is trusted",
        ),
    ] = "",
) -> None:
    """Add an already-installed compute node; its SSH host key is pinned on this first contact
    (with --host-key-fingerprint: only if it is that key, checked before any login)."""
    body: dict[str, Any] = {"node_ip": node_ip, "ssh_username": user, "ssh_port": port}
    if key is not None:
        try:
            body["ssh_private_key"] = key.read_text()
        except OSError as exc:
            raise CliError(f"cannot read {key}: {exc.strerror}") from None
    if password_stdin:
        body["ssh_password"] = sys.stdin.readline().rstrip("\n")
    if hostname:
        body["hostname"] = hostname
    if bmc:
        body["bmc_ip"] = bmc
    if host_key_fingerprint:
        body["ssh_host_key_fingerprint"] = host_key_fingerprint
    with api() as a:
        r = a.post("/controlnode/nodes", json=body)
    emit(r, table("adopted", [r], ["node_ip", "hostname", "host_key_fingerprint"]))


@nodes_app.command("show")
def nodes_show(node_ip: NodeIp) -> None:
    """One compute node: addresses, how it was added, its pinned host key, its fabric state."""
    with api() as a:
        r = a.get(f"/controlnode/nodes/{node_ip}")
    t = Table(title=f"node {node_ip}", show_header=False)
    for k, v in r.items():
        t.add_row(k, str(v))
    emit(r, t)


@nodes_app.command("remove")
def nodes_remove(node_ip: NodeIp) -> None:
    """Remove a compute node (refused while it holds fabric state: tear it down first)."""
    with api() as a:
        r = a.delete(f"/controlnode/nodes/{node_ip}")
    emit(r or {"node_ip": node_ip, "removed": True})


def _until_state(value: str) -> str:
    if value and value not in STATE_ORDER:
        raise typer.BadParameter(f"{value!r} is not a job state; one of: {', '.join(STATE_ORDER)}")
    return value


Until = Annotated[
    str,
    typer.Option(
        metavar="STATE",
        callback=_until_state,
        help=f"with --watch: stop once the job reaches this state ({', '.join(STATE_ORDER)})",
    ),
]


def provision(
    bmc: Annotated[str, typer.Argument(metavar="BMC", help="the BMC's IP address (as in the inventory)")],
    vendor: Annotated[
        str, typer.Option(help="BMC driver: generic, dell, hp, lenovo, supermicro, cisco")
    ] = "generic",
    os: Annotated[str, typer.Option("--os", help="Debian release: 12 or 13")] = "12",
    hostname: Annotated[str, typer.Option(help="OS hostname")] = "",
    ssh_key: Annotated[list[Path], typer.Option(help="an OpenSSH public key file to authorize")] = [],  # noqa: B006
    method: Annotated[
        str, typer.Option(help="install method: image or preseed (default: deployment's)")
    ] = "",
    image: Annotated[
        str, typer.Option(help="a catalog image to install instead of Karios's Debian (karios images list)")
    ] = "",
    disk: Annotated[list[str], typer.Option(help="an install disk (repeat for a pool), e.g. sda")] = [],  # noqa: B006
    pool: Annotated[
        str, typer.Option(help="pool_type of the disks: single, mirror, stripe, raidz1, raidz2")
    ] = "",
    pool_backend: Annotated[
        str, typer.Option(help="zfs or md (default: zfs for a pool of several disks, md for one)")
    ] = "",
    watch: Watch = False,
    until: Until = "",
) -> None:
    """Provision a server by its BMC address; --watch follows it."""
    body: dict[str, Any] = {"bmc_IP": bmc, "vendor": vendor, "debian_version": os}
    if hostname:
        body["hostname"] = hostname
    if method:
        body["install_method"] = method
    if image:
        body["image"] = image
    if disk:
        body["selected_disks"] = disk
    if pool:
        body["pool_type"] = pool
    if pool_backend:
        body["pool_backend"] = pool_backend
    if ssh_key:
        body["ssh_authorized_keys"] = [p.read_text().strip() for p in ssh_key]
    with api() as a:
        acc = a.post("/controlnode/provision", json=body)
        if not watch:
            emit(acc, table("accepted", [acc], ["job_id", "status", "message"]))
            return
        console.print(f"job {acc['job_id']} accepted for {bmc}")
        raise typer.Exit(watch_jobs(a, [acc["job_id"]], console, until=until or None))


def unprovision(
    bmc: Annotated[str, typer.Argument(metavar="BMC", help="the BMC's IP address")],
    vendor: Annotated[str, typer.Option(help="BMC driver")] = "generic",
    watch: Watch = False,
    until: Until = "",
) -> None:
    """Wipe a server's disks and leave its BMC clean; --watch follows it."""
    with api() as a:
        acc = a.post("/controlnode/unprovision", json={"bmc_ip": bmc, "vendor": vendor})
        if not watch:
            emit(acc, table("accepted", [acc], ["job_id", "status", "message"]))
            return
        console.print(f"job {acc['job_id']} accepted for {bmc}")
        raise typer.Exit(watch_jobs(a, [acc["job_id"]], console, until=until or None))


_SINCE = re.compile(r"(\d+)\s*([smhdw])")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: a duration back from now (``90s``, ``30m``, ``2h``, ``1d``, ``1w``) or an ISO 8601
    date/time (without a zone: this machine's local time)."""
    text = text.strip()
    m = _SINCE.fullmatch(text)
    if m:
        return (now or datetime.now(UTC)) - timedelta(**{_UNIT[m.group(2)]: int(m.group(1))})
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"--since {text!r}: expected a duration (30m, 2h, 1d, 1w) or an ISO date/time (2026-12-04T10:00)",
            2,
        ) from None
    return when if when.tzinfo else when.astimezone()


JOB_COLUMNS = ["id", "bmc_ip", "job_type", "status", "job_status", "progress", "created_at", "message"]


def jobs(
    watch: Watch = False,
    all_: Annotated[
        bool, typer.Option("--all", "-a", help="history: every job, ended ones too (newest first)")
    ] = False,
    since: Annotated[
        str, typer.Option(metavar="WHEN", help="history since 30m, 2h, 1d, 1w or an ISO date/time")
    ] = "",
    status: Annotated[
        list[str],
        typer.Option(help="history: only this status (running, completed, failed, cancelled, stuck)"),
    ] = [],  # noqa: B006
    bmc: Annotated[str, typer.Option(metavar="BMC", help="history: only this BMC's jobs")] = "",
    limit: Annotated[int, typer.Option(min=1, max=1000, help="history: at most this many jobs")] = 50,
) -> None:
    """Queued and active provisioning jobs; --all/--since/--status/--bmc: the history. --watch
    follows every active job and each one started while it runs, until Ctrl-C."""
    history = all_ or since or status or bmc
    if watch and history:
        raise CliError("--watch follows the active jobs; it does not go with --all/--since/--status/--bmc", 2)
    with api() as a:
        if history:
            params: dict[str, Any] = {"limit": limit, "status": status}
            if since:
                params["since"] = parse_since(since).isoformat()
            if bmc:
                params["bmc_ip"] = bmc
            page = a.get("/controlnode/jobs", params=params)
            title = f"jobs: {len(page['items'])} of {page['total']}" + (f" since {since}" if since else "")
            emit(page, table(title, page["items"], JOB_COLUMNS))
            return
        q = a.get("/controlnode/provision/queue")
        if not watch:
            cols = ["job_id", "bmc_ip", "job_type", "state", "position", "created_at"]
            title = f"jobs: {q['active']} active, {q['queued']} queued (history: --all, --since)"
            emit(q, table(title, q["entries"], cols))
            return
        ids = [e["job_id"] for e in q["entries"]]
        console.print(
            f"following {len(ids)} active job(s) and every new one (Ctrl-C stops)"
            if ids
            else "no active or queued jobs: following new ones (Ctrl-C stops)"
        )
        raise typer.Exit(watch_jobs(a, ids, console, follow_new=True))


def resolve_job(a: Api, ref: str) -> str:
    """The job id `ref` names: itself, or the one job whose id starts with it. No job → a 404-style
    error; several → an error listing them (give more characters)."""
    ref = ref.strip()
    if not ref:
        raise CliError("a job id (or its first characters) is needed", 2)
    try:
        page = a.get("/controlnode/jobs", params={"id_prefix": ref, "limit": 10})
    except CliError as err:
        if err.status in (404, 405) and not (isinstance(err.body, dict) and err.body.get("code")):
            return ref  # a gateway without GET /controlnode/jobs: the id as given
        raise
    items = page.get("items") or []
    if any(j.get("id") == ref for j in items):
        return ref
    if not items:
        raise CliError(
            f"no job {ref!r} (404): no job id is or starts with it; `karios jobs --all` lists them",
            1,
            status=404,
        )
    total = int(page.get("total") or len(items))
    if total > 1:
        listed = "; ".join(
            f"{j['id']} ({j.get('bmc_ip', '')} {j.get('job_type', '')} {j.get('status', '')}, "
            f"{str(j.get('created_at', ''))[:19]})"
            for j in items
        )
        more = f"; and {total - len(items)} more" if total > len(items) else ""
        raise CliError(
            f"job id prefix {ref!r} is ambiguous: {total} jobs start with it: {listed}{more}; "
            "give more characters",
            1,
        )
    return str(items[0]["id"])


@job_app.command("show")
def job_show(job_id: JobRef) -> None:
    """A job's state, progress, message and the installer's last log lines."""
    with api() as a:
        job_id = resolve_job(a, job_id)
        j = a.get(f"/controlnode/job/{job_id}")
    t = Table(title=f"job {job_id}", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")
    for k in (
        "job_type",
        "bmc_ip",
        "job_status",
        "status",
        "progress",
        "message",
        "created_at",
        "updated_at",
    ):
        t.add_row(k, str(j.get(k, "")))
    if j.get("log_tail"):
        t.add_row("log", "\n".join(j["log_tail"][-10:]))
    emit(j, t)


@job_app.command("cancel")
def job_cancel(job_id: JobRef) -> None:
    """Cancel a job (its BMC is left clean)."""
    with api() as a:
        job_id = resolve_job(a, job_id)
        r = a.post(f"/controlnode/job/{job_id}/cancel")
    emit(r, table("cancel", [r or {}], ["job_id", "status", "message"]))


@token_app.command("create")
def token_create(
    name: TokenName,
    role: Annotated[str, typer.Option(help="viewer | operator | fabric_admin")] = "operator",
) -> None:
    """Create a token; it is printed once. A live token of that name is refused (rotate it)."""
    with api() as a:
        r = a.post("/controlnode/tokens", json={"name": name, "role": role})
    _print_token(r)


@token_app.command("rotate")
def token_rotate(
    name: TokenName,
    role: Annotated[str | None, typer.Option(help="a new role (viewer | operator | fabric_admin)")] = None,
) -> None:
    """A new secret for the token NAME (role kept unless --role); the old one stops working."""
    with api() as a:
        r = a.post(f"/controlnode/tokens/{name}/rotate", json={"role": role} if role else {})
    _print_token(r)


def _print_token(r: Any) -> None:
    if STATE["output"] == "json":
        emit(r)
    else:
        sys.stdout.write(r["token"] + "\n")


@token_app.command("list")
def token_list() -> None:
    """Every token: name, role, when created, whether revoked (never the secret)."""
    with api() as a:
        r = a.get("/controlnode/tokens")
    emit(r, table("tokens", r, ["name", "role", "created_at", "revoked"]))


@token_app.command("revoke")
def token_revoke(name: TokenName) -> None:
    """Revoke the token NAME: it stops working at once."""
    with api() as a:
        r = a.delete(f"/controlnode/tokens/{name}")
    emit(r, table("revoked", [r], ["name", "role", "revoked"]))


def events(
    channel: Annotated[
        list[str], typer.Option(help="provision, fabric, job:<id>, node:<ip> (repeatable)")
    ] = [],  # noqa: B006
    since: Annotated[int | None, typer.Option(help="replay from after this event id")] = None,
) -> None:
    """Print events as they happen (one JSON object per line) until interrupted."""
    with api() as a:
        for ev in stream(a, channel, last_event_id=since):
            sys.stdout.write(json.dumps({"id": ev.id, "event": ev.name, "data": ev.data}) + "\n")
            sys.stdout.flush()
