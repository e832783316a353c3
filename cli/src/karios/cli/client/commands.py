"""The client verbs (typer): each is one or two gateway calls plus a table, JSON or live progress.

``--output json`` (on the root: ``karios --output json jobs``) prints the gateway's JSON as is, for
scripts. Errors print one ``karios: …`` line and exit non-zero (2 unreachable, 3 auth, 4 busy).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from karios.cli.client.api import Api, CliError
from karios.cli.client.context import ClientContext, save_context
from karios.cli.client.shared import STATE, Watch, api, console, emit, table
from karios.cli.client.sse import stream
from karios.cli.client.watch import watch_jobs

token_app = typer.Typer(help="API tokens (create, rotate, list, revoke) via the gateway; needs fabric_admin")
job_app = typer.Typer(help="one job: show or cancel")
nodes_app = typer.Typer(help="compute nodes: list, adopt, show, remove")


def login(
    url: Annotated[str, typer.Argument(help="the gateway, e.g. http://10.0.0.5:8080")],
    token: Annotated[str, typer.Option(prompt=True, hide_input=True, help="an API token (kt_…)")],
) -> None:
    """Check URL + token against the gateway and keep them in the client context (mode 0600)."""
    ctx = ClientContext(url=url.rstrip("/"), token=token)
    with Api(ctx) as a:
        me = a.get("/controlnode/tokens/self")
    ctx.name = me["name"]
    path = save_context(ctx)
    console.print(f"logged in to {ctx.url} as {me['name']} ({me['role']}); context in {path}")


@nodes_app.callback(invoke_without_command=True)
def nodes(ctx: typer.Context) -> None:
    """The fabric's compute nodes (adopted, registered at first boot, or by BMC with an OS IP)."""
    if ctx.invoked_subcommand is not None:
        return
    with api() as a:
        data = a.get("/controlnode/nodes", params={"limit": 1000})
    rows = data.get("items", data) if isinstance(data, dict) else data
    cols = ["node_ip", "hostname", "bmc_ip", "source", "auth", "host_key_fingerprint"]
    emit(data, table("nodes", rows, cols))


@nodes_app.command("adopt")
def nodes_adopt(
    node_ip: Annotated[str, typer.Argument(help="the installed node's OS (SSH) address")],
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
def nodes_show(node_ip: str) -> None:
    with api() as a:
        r = a.get(f"/controlnode/nodes/{node_ip}")
    t = Table(title=f"node {node_ip}", show_header=False)
    for k, v in r.items():
        t.add_row(k, str(v))
    emit(r, t)


@nodes_app.command("remove")
def nodes_remove(node_ip: str) -> None:
    """Remove a compute node (refused while it holds fabric state: tear it down first)."""
    with api() as a:
        r = a.delete(f"/controlnode/nodes/{node_ip}")
    emit(r or {"node_ip": node_ip, "removed": True})


def provision(
    bmc: Annotated[str, typer.Argument(help="the BMC's IP address (as in the inventory)")],
    vendor: Annotated[
        str, typer.Option(help="BMC driver: generic, dell, hp, lenovo, supermicro, cisco")
    ] = "generic",
    os: Annotated[str, typer.Option("--os", help="Debian release: 12 or 13")] = "12",
    hostname: Annotated[str, typer.Option(help="OS hostname")] = "",
    ssh_key: Annotated[list[Path], typer.Option(help="an OpenSSH public key file to authorize")] = [],  # noqa: B006
    method: Annotated[
        str, typer.Option(help="install method: image or preseed (default: deployment's)")
    ] = "",
    watch: Watch = False,
    until: Annotated[str, typer.Option(help="with --watch: stop once the job reaches this state")] = "",
) -> None:
    """Provision a server by its BMC address; --watch follows it."""
    body: dict[str, Any] = {"bmc_IP": bmc, "vendor": vendor, "debian_version": os}
    if hostname:
        body["hostname"] = hostname
    if method:
        body["install_method"] = method
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
    bmc: Annotated[str, typer.Argument(help="the BMC's IP address")],
    vendor: Annotated[str, typer.Option(help="BMC driver")] = "generic",
    watch: Watch = False,
) -> None:
    """Wipe a server's disks and leave its BMC clean."""
    with api() as a:
        acc = a.post("/controlnode/unprovision", json={"bmc_ip": bmc, "vendor": vendor})
        if not watch:
            emit(acc, table("accepted", [acc], ["job_id", "status", "message"]))
            return
        raise typer.Exit(watch_jobs(a, [acc["job_id"]], console))


def jobs(watch: Watch = False) -> None:
    """Queued and active provisioning jobs; --watch follows the active ones."""
    with api() as a:
        q = a.get("/controlnode/provision/queue")
        if not watch:
            cols = ["job_id", "bmc_ip", "job_type", "state", "position", "created_at"]
            emit(q, table(f"jobs: {q['active']} active, {q['queued']} queued", q["entries"], cols))
            return
        ids = [e["job_id"] for e in q["entries"]]
        if not ids:
            console.print("no active or queued jobs")
            return
        raise typer.Exit(watch_jobs(a, ids, console))


@job_app.command("show")
def job_show(job_id: str) -> None:
    """A job's state, progress, message and the installer's last log lines."""
    with api() as a:
        j = a.get(f"/controlnode/job/{job_id}")
    t = Table(title=f"job {job_id}", show_header=False)
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
def job_cancel(job_id: str) -> None:
    """Cancel a job (its BMC is left clean)."""
    with api() as a:
        r = a.post(f"/controlnode/job/{job_id}/cancel")
    emit(r, table("cancel", [r or {}], ["job_id", "status", "message"]))


@token_app.command("create")
def token_create(
    name: str,
    role: Annotated[str, typer.Option(help="viewer | operator | fabric_admin")] = "operator",
) -> None:
    """Create a token; it is printed once. A live token of that name is refused (rotate it)."""
    with api() as a:
        r = a.post("/controlnode/tokens", json={"name": name, "role": role})
    _print_token(r)


@token_app.command("rotate")
def token_rotate(
    name: str,
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
    with api() as a:
        r = a.get("/controlnode/tokens")
    emit(r, table("tokens", r, ["name", "role", "created_at", "revoked"]))


@token_app.command("revoke")
def token_revoke(name: str) -> None:
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
