"""``karios server show BMC_IP [--hardware]``: a server as the inventory lists it, and with
``--hardware`` what its BMC reported at the last inspection and how that differs from the
inventory (``GET /controlnode/bmc/{ip}/hardware`` and ``…/hardware/diff``, operator role).

``-o json`` prints the gateway's JSON as is: ``{"hardware": …, "diff": …}`` with ``--hardware``,
else the inventory's disks and NICs.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from karios.cli.client.api import CliError
from karios.cli.client.shared import STATE, App, api, emit, print_table, table

server_app = App(
    help="a server by its BMC address: show (the inventory's record; --hardware: the BMC's and the diff)"
)
OUTPUTS = ("table", "wide", "json")
CATEGORIES = ("serial", "disks", "nics", "gpus")

BmcIp = Annotated[str, typer.Argument(metavar="BMC_IP", help="the server's BMC (out-of-band) address")]


def record_table(rec: dict[str, Any]) -> Table:
    """The hardware record's summary: identity, CPUs, memory, counts, gaps."""
    system, bmc = rec.get("system") or {}, rec.get("bmc") or {}
    nics = [n for n in rec.get("nics") or [] if not n.get("host_interface")]
    drives = rec.get("drives") or []
    size = sum(d.get("size_gb") or 0 for d in drives)
    rows = [
        ("inspected", f"{rec.get('inspected_at', '')} (driver {rec.get('driver', '')})"),
        ("system", " ".join(v for v in (system.get("manufacturer", ""), system.get("model", "")) if v)),
        ("serial", system.get("serial", "")),
        ("power", system.get("power_state", "")),
        ("bios", system.get("bios_version", "")),
        ("cpus", f"{rec.get('processor_count') or 0}"),
        ("memory", f"{rec.get('memory_total_gib')} GiB" if rec.get("memory_total_gib") is not None else ""),
        ("disks", f"{len(drives)} ({size:g} GB)"),
        ("nics", ", ".join(n.get("mac", "") for n in nics)),
        ("gpus", f"{len(rec.get('gpus') or [])}"),
        ("bmc", " ".join(v for v in (bmc.get("model", ""), bmc.get("firmware_version", "")) if v)),
    ]
    rows += [("missing", m) for m in rec.get("missing") or []]
    t = Table(title=f"hardware of {rec.get('bmc_ip', '')} (as its BMC reported it)", show_header=False)
    t.add_column("field", no_wrap=True)
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, str(v))
    return t


def diff_rows(diff: dict[str, Any]) -> list[dict[str, str]]:
    """One row per difference: category, where (bmc only | inventory only | differs), item, detail."""
    rows: list[dict[str, str]] = []
    for cat in CATEGORIES:
        c = diff.get(cat) or {}
        for side, where in (("only_bmc", "BMC only"), ("only_inventory", "inventory only")):
            for i in c.get(side) or []:
                detail = ", ".join(
                    v for v in (i.get("name", ""), i.get("summary", "")) if v and v != i.get("key")
                )
                rows.append({"category": cat, "where": where, "item": i.get("key", ""), "detail": detail})
        for p in c.get("differ") or []:
            detail = "; ".join(
                f"{d['field']}: BMC {d['bmc']} / inventory {d['inventory']}"
                for d in p.get("differences") or []
            )
            rows.append({"category": cat, "where": "differs", "item": p.get("key", ""), "detail": detail})
    return rows


def diff_table(diff: dict[str, Any]) -> Table:
    n = diff.get("differences", 0)
    state = "in sync" if diff.get("in_sync") else f"{n} difference{'s' if n != 1 else ''}"
    title = f"BMC vs inventory ({diff.get('device_name', '')}): {state}"
    t = table(title, diff_rows(diff), ["category", "where", "item", "detail"])
    unchecked = diff.get("unchecked") or []
    if unchecked:
        t.caption = "not compared: " + "; ".join(unchecked)
    return t


@server_app.command("show")
def server_show(
    bmc_ip: BmcIp,
    hardware: Annotated[
        bool,
        typer.Option(
            "--hardware",
            help="what the BMC reported at its last inspection (`POST …/inspect` first) and how it "
            "differs from the inventory: serial, disks, NICs/MACs, GPUs",
        ),
    ] = False,
    output: Annotated[
        str | None, typer.Option("--output", "-o", metavar="FORMAT", help="table, wide or json")
    ] = None,
) -> None:
    """One server by its BMC address: the inventory's disks and NICs, or with --hardware the BMC's
    hardware record and its differences from the inventory (needs an operator token)."""
    if output is not None:
        if output not in OUTPUTS:
            raise CliError(f"--output {output!r}: expected one of {', '.join(OUTPUTS)}", 2)
        STATE["output"] = output
    with api() as a:
        if not hardware:
            inv = a.get(f"/controlnode/bmc/{bmc_ip}/disks")
            rows = [
                {"kind": "disk", "name": d.get("name", ""), "detail": _disk(d)}
                for d in inv.get("disks") or []
            ]
            rows += [
                {"kind": "nic", "name": n.get("name", ""), "detail": ", ".join(n.get("macs") or [])}
                for n in inv.get("nics") or []
            ]
            emit(
                inv,
                table(
                    f"server {bmc_ip}: {inv.get('device_name', '')} (inventory)",
                    rows,
                    ["kind", "name", "detail"],
                ),
            )
            return
        rec = a.get(f"/controlnode/bmc/{bmc_ip}/hardware")
        diff = a.get(f"/controlnode/bmc/{bmc_ip}/hardware/diff")
    if STATE["output"] == "json":
        emit({"hardware": rec, "diff": diff})
        return
    print_table(record_table(rec))
    print_table(diff_table(diff))


def _disk(d: dict[str, Any]) -> str:
    size = f"{d['size_gb']:g} GB" if d.get("size_gb") is not None else ""
    return ", ".join(v for v in (d.get("model", ""), size, d.get("serial", "")) if v)
