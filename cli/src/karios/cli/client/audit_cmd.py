"""``karios audit``: the gateway's audit trail (``GET /controlnode/audit``, needs fabric_admin).

Newest first. ``--limit N`` records in all (the gateway's pages of at most 1,000 are followed
with ``before``); ``-o json`` prints ``{"records": [...], "next_before": …}`` for scripts.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from karios.cli.client.api import CliError
from karios.cli.client.commands import parse_since
from karios.cli.client.shared import STATE, api, emit, table

PAGE = 1000
COLUMNS = ["time", "actor", "role", "method", "route", "target", "status", "job_id", "trace_id"]
OUTPUTS = ("table", "wide", "json")


def audit(
    since: Annotated[
        str,
        typer.Option(
            metavar="WHEN", help="records since 30m, 2h, 1d, 1w or an ISO date/time (local if no zone)"
        ),
    ] = "",
    actor: Annotated[
        str, typer.Option(metavar="NAME", help="only this token's requests (`unknown`: refused tokens)")
    ] = "",
    action: Annotated[
        str,
        typer.Option(
            metavar="TEXT",
            help="a method (DELETE), part of a route (tokens), or both (POST /controlnode/provision)",
        ),
    ] = "",
    target: Annotated[
        str, typer.Option(metavar="TARGET", help="a BMC IP, job id, node IP or token name")
    ] = "",
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="at most this many records")] = 50,
    output: Annotated[
        str | None, typer.Option("--output", "-o", metavar="FORMAT", help="table, wide or json")
    ] = None,
) -> None:
    """Who changed what: every state-changing request (token name and role, method and route,
    target, HTTP status, trace id), newest first. Needs a fabric_admin token."""
    if output is not None:
        if output not in OUTPUTS:
            raise CliError(f"--output {output!r}: expected one of {', '.join(OUTPUTS)}", 2)
        STATE["output"] = output
    params: dict[str, Any] = {
        k: v for k, v in (("actor", actor), ("action", action), ("target", target)) if v
    }
    if since:
        params["since"] = parse_since(since).isoformat()  # as `karios jobs --since` reads it
    records: list[dict[str, Any]] = []
    next_before = None
    with api() as a:
        while len(records) < limit:
            page = a.get(
                "/controlnode/audit",
                params={**params, "limit": min(PAGE, limit - len(records))}
                | ({"before": next_before} if next_before else {}),
            )
            records.extend(page["records"])
            next_before = page.get("next_before")
            if not next_before:
                break
    title = f"audit: {len(records)} record(s)" + (f" since {since}" if since else "")
    if next_before:
        title += f" (more: --limit {limit * 2})"
    emit({"records": records, "next_before": next_before}, table(title, records, COLUMNS))
