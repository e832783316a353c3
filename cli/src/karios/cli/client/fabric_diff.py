"""``karios fabric diff`` and the preview ``karios fabric apply`` prints before it asks: per node,
what the apply would change in its FRR files (unified diffs, secrets already redacted by the
worker) and links (vtep0, vxlanN, brN), from ``POST /controlnode/fabric-config/diff``."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.syntax import Syntax

from karios.cli.client.api import Api

DIFF_PATH = "/controlnode/fabric-config/diff"


def fetch_diff(api: Api, node_ip: str = "") -> dict[str, Any]:
    """The gateway's preview (an SSH round to every node: a longer timeout than other calls)."""
    params = {"node_ip": node_ip} if node_ip else None
    return api.call("POST", DIFF_PATH, params=params, timeout=120.0)


def _who(n: dict[str, Any]) -> str:
    ip, fqdn = n.get("node_ip", ""), n.get("fqdn", "")
    return f"{fqdn} ({ip})" if fqdn and fqdn != ip else ip


def print_diff(view: dict[str, Any], console: Console) -> None:
    """Each node: "no change", its error, or its link changes and file diffs; then a summary."""
    for n in view.get("nodes") or []:
        who = _who(n)
        if n.get("error"):
            kind = "unreachable" if not n.get("reachable", True) else "error"
            console.print(f"[bold red]{who}: {kind}:[/] {n['error']}")
            continue
        if not n.get("changed"):
            console.print(f"[green]{who}: no change[/]")
            continue
        notes = [f"vtep {n.get('vtep_ip', '')}" + ("" if n.get("vtep_allocated") else " (to allocate)")]
        if n.get("frr_install"):
            notes.append("installs FRR")
        if n.get("frr_action", "none") != "none":
            notes.append(f"FRR {n['frr_action']}")
        console.print(f"[bold yellow]{who}: changes[/] ({', '.join(notes)})")
        for link in n.get("links") or []:
            console.print(f"  link {link['device']:<10} {link['action']:<8} {link.get('detail', '')}")
        for f in n.get("files") or []:
            console.print(f"  /etc/frr/{f['name']} ({f['change']})")
            console.print(Syntax(f.get("diff", ""), "diff", theme="ansi_dark", background_color="default"))
    console.print(
        f"{view.get('nodes_changed', 0)} of {view.get('nodes_total', 0)} node(s) would change"
        + (f", {view['nodes_failed']} could not be checked" if view.get("nodes_failed") else "")
    )


def show_diff(view: dict[str, Any], console: Console, *, as_json: bool) -> None:
    """``karios fabric diff``: the preview, or the gateway's JSON as is (``--output json``)."""
    if as_json:
        sys.stdout.write(json.dumps(view, indent=2, default=str) + "\n")
    else:
        print_diff(view, console)


def preview(view: dict[str, Any], console: Console, *, as_json: bool, force: bool) -> bool:
    """Before ``karios fabric apply``: print the preview; False = no node would change (and none
    failed to be checked), so there is nothing to apply unless `force`."""
    if not as_json:
        print_diff(view, console)
    if view.get("changed") or view.get("nodes_failed") or force:
        return True
    if as_json:
        sys.stdout.write(json.dumps(view, indent=2, default=str) + "\n")
    else:
        console.print("no change on any node: nothing applied (--force applies anyway)")
    return False
