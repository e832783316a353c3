"""The ``karios fabric`` verbs: show/set/plan/preflight/diff/apply/status/cancel/teardown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from karios.cli.client.api import CliError
from karios.cli.client.fabric_ack import ack_fields, needs_ack, show_ack_needed
from karios.cli.client.fabric_diff import fetch_diff, preview, show_diff
from karios.cli.client.shared import STATE, App, Watch, api, body_from, console, emit, table
from karios.cli.client.watch import watch_fabric

fabric_app = App(
    help="the EVPN/VXLAN fabric: show, set, plan, preflight, diff, apply, status, cancel, teardown"
)


Pairs = Annotated[
    list[str], typer.Argument(metavar="KEY=VALUE...", help="fields as key=value (values parsed as YAML)")
]
FileOpt = Annotated[Path | None, typer.Option("--file", "-f", help="fields from a JSON/YAML file")]


@fabric_app.command("show")
def fabric_show() -> None:
    """The stored fabric configuration and its rollout status."""
    with api() as a:
        cfg = a.get("/controlnode/fabric-config")
    t = Table(title="fabric-config", show_header=False)
    for k, v in sorted(cfg.items()):
        if k != "last_job":
            t.add_row(k, json.dumps(v) if isinstance(v, dict | list) else str(v))
    emit(cfg, t)


@fabric_app.command("set")
def fabric_set(
    pairs: Pairs = [],  # noqa: B006
    file: FileOpt = None,
    ack: Annotated[
        str, typer.Option("--ack", metavar="HASH", help="the switch_snippet_hash of the snippet applied")
    ] = "",
    acked_by: Annotated[
        str, typer.Option("--acked-by", metavar="NAME", help="who applied the switch snippet (audit log)")
    ] = "",
    all_nos: Annotated[bool, typer.Option("--all-nos", help="on an ack: the snippets of every NOS")] = False,
    skip_switch_ack: Annotated[
        bool, typer.Option("--skip-switch-ack", help="store without the switch ack (fabric_admin; audited)")
    ] = False,
) -> None:
    """Create or update the fabric configuration. A change the switch must follow (its BGP listen
    range moves) prints the switch snippet and its hash, and exits 5: apply it on the switch, then
    re-run with --ack HASH --acked-by NAME."""
    body = body_from(file, pairs) | ack_fields(ack, acked_by, skip_switch_ack)
    with api() as a:
        try:
            r = a.post("/controlnode/fabric-config", json=body)
        except CliError as err:
            gate = needs_ack(err)
            if gate is None:
                raise
            raise show_ack_needed(
                gate, console, pairs=pairs, file=file, all_nos=all_nos, acked_by=acked_by,
                as_json=STATE["output"] == "json",
            ) from None  # fmt: skip
    emit(r, table("fabric-config", [r], ["fabric_switch_nos", "vtep_pool_cidr", "rollout_status"]))


@fabric_app.command("plan")
def fabric_plan(pairs: Pairs = [], file: FileOpt = None) -> None:  # noqa: B006
    """A suggested configuration (nothing stored)."""
    with api() as a:
        r = a.post("/controlnode/fabric-config/plan", json=body_from(file, pairs))
    emit(r, table("plan", [r], ["plan_hash", "local_as", "fabric_switch_as", "fabric_switch_peering_ip"]))


@fabric_app.command("preflight")
def fabric_preflight(pairs: Pairs = [], file: FileOpt = None) -> None:  # noqa: B006
    """Read-only checks of every node (underlay, MTU, reachability, pool headroom)."""
    with api() as a:
        r = a.post("/controlnode/fabric-config/preflight", json=body_from(file, pairs))
    t = table(
        f"preflight: {'ready' if r.get('ready') else 'NOT ready'} (max vxlan_mtu {r.get('max_vxlan_mtu')})",
        r.get("nodes", []),
        ["node_ip", "fqdn", "mode", "bridge", "bridge_mtu", "reason"],
    )
    emit(r, t)
    for b in r.get("blockers") or []:
        console.print(f"blocker: {b.get('kind')} {b.get('node_ip', '')}: {b.get('message')}")


@fabric_app.command("diff")
def fabric_diff(node: Annotated[str, typer.Option(help="only this node (its OS IP)")] = "") -> None:
    """What an apply would change on each node (FRR files, links); nothing is changed."""
    with api() as a:
        show_diff(fetch_diff(a, node), console, as_json=STATE["output"] == "json")


@fabric_app.command("apply")
def fabric_apply(
    watch: Watch = False,
    force: Annotated[
        bool, typer.Option(help="apply despite preflight blockers (fabric_admin), or with no change")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
) -> None:
    """Show each node's diff, ask (unless --yes), then roll the fabric out to every node."""
    with api() as a:
        if not preview(fetch_diff(a), console, as_json=STATE["output"] == "json", force=force):
            return  # no node would change
        if not yes and not typer.confirm("Apply the fabric configuration to every registered node?"):
            raise typer.Exit(1)
        acc = a.post("/controlnode/fabric-config/apply", params={"force": "true"} if force else None)
        if not watch:
            emit(acc, table("accepted", [acc], ["apply_job_id", "message"]))
            return
        console.print(f"fabric apply {acc['apply_job_id']} accepted")
        raise typer.Exit(watch_fabric(a, acc["apply_job_id"], console))


@fabric_app.command("cancel")
def fabric_cancel(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="the apply's job id (fabric status shows it)")],
    watch: Watch = False,
) -> None:
    """Cancel an in-flight apply (nodes roll back)."""
    with api() as a:
        r = a.post(f"/controlnode/fabric-config/apply/{job_id}/cancel")
        if not watch:
            emit(r, table("cancel", [r], ["job_id", "state", "message"]))
            return
        code = watch_fabric(a, job_id, console)
    raise typer.Exit(0 if code == 1 else code)  # a cancelled apply is what was asked for


@fabric_app.command("status")
def fabric_status(watch: Watch = False) -> None:
    """The latest fabric job with its per-node results."""
    with api() as a:
        view = a.get("/controlnode/fabric-config/latest")
        if watch and view.get("job_status") == "running":
            raise typer.Exit(watch_fabric(a, view["job_id"], console))
    from karios.cli.client.watch import node_table

    emit(view, node_table(view))


@fabric_app.command("teardown")
def fabric_teardown(
    watch: Watch = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
) -> None:
    """Delete the fabric configuration and remove EVPN from every node."""
    if not yes and not typer.confirm("Remove the fabric from every node?"):
        raise typer.Exit(1)
    with api() as a:
        r = a.delete("/controlnode/fabric-config")
        job_id = (r or {}).get("teardown_job_id") or (r or {}).get("job_id")
        if not watch or not job_id:
            emit(r)
            return
        raise typer.Exit(watch_fabric(a, job_id, console))
