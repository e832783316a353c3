"""What every client verb module uses (:mod:`~karios.cli.client.commands`,
:mod:`~karios.cli.client.fabric_cmds`): the gateway client of the saved context, the ``--output``
state the root callback sets, tables or JSON out, request bodies in, the ``--watch`` option."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from karios.cli.client.api import Api, CliError
from karios.cli.client.context import load_context

console = Console(highlight=False)
STATE: dict[str, Any] = {"output": "table"}


def api() -> Api:
    return Api(load_context())


def emit(data: Any, table: Table | None = None) -> None:
    if STATE["output"] == "json" or table is None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        console.print(table)


def table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> Table:
    t = Table(title=title)
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(r.get(c, "")) for c in cols])
    return t


def body_from(file: Path | None, pairs: list[str]) -> dict[str, Any]:
    """A request body from a JSON/YAML file and/or ``key=value`` pairs (values parsed as YAML)."""
    body: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise CliError(f"cannot read {file}: {exc}") from None
        if not isinstance(loaded, dict):
            raise CliError(f"{file}: expected a mapping of fields")
        body.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{pair!r}: expected key=value")
        body[key] = yaml.safe_load(value) if value else ""
    return body


Watch = Annotated[bool, typer.Option("--watch", "-w", help="follow live progress until the end")]
