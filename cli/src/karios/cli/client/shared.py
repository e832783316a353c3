"""What every client verb module uses (:mod:`~karios.cli.client.commands`,
:mod:`~karios.cli.client.fabric_cmds`): the gateway client of the selected context, the
``--output``/``--context`` state the root callback sets, tables or JSON out, request bodies in,
the ``--watch`` option, and the typer classes whose usage lines read ``BMC``, not ``{bmc}``.

Ids are never cut: in a pipe (stdout not a terminal) and with ``-o wide`` a table is as wide as
its content; on a terminal a table shows an id's first 8 characters (``job show`` takes a unique
prefix) and folds long text instead of cutting it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from karios.cli.client.api import Api, CliError
from karios.cli.client.context import load_context

console = Console(highlight=False)
STATE: dict[str, Any] = {"output": "table", "context": None}
#: Columns holding an id: shortened on a terminal (``-o wide``: full), full in a pipe.
ID_COLUMNS = frozenset({"id", "job_id", "apply_job_id", "parent_id"})
SHORT_ID = 8
#: How wide a "wide" table may get (its content decides; this only lifts the terminal's limit).
WIDE = 10_000


def api() -> Api:
    return Api(load_context(STATE.get("context")))


def wide(con: Console | None = None) -> bool:
    """Full ids and uncut cells: ``-o wide``, or stdout is not a terminal (a pipe, a file, CI)."""
    return STATE["output"] == "wide" or not (con or console).is_terminal


def show_id(value: Any, con: Console | None = None) -> str:
    text = str(value or "")
    return text if wide(con) else text[:SHORT_ID]


def print_table(t: Table, con: Console | None = None) -> None:
    """A table on `con`: as wide as its content when :func:`wide`, else folded to the terminal."""
    con = con or console
    if wide(con):
        Console(highlight=False, width=WIDE, file=con.file, force_terminal=con.is_terminal).print(t)
    else:
        con.print(t)


def emit(data: Any, table: Table | None = None) -> None:
    if STATE["output"] == "json" or table is None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        print_table(table)


def table(title: str, rows: list[dict[str, Any]], cols: list[str], con: Console | None = None) -> Table:
    t = Table(title=title)
    for c in cols:
        if c in ID_COLUMNS:
            t.add_column(c, no_wrap=True, min_width=SHORT_ID)
        else:
            t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[show_id(r.get(c), con) if c in ID_COLUMNS else str(r.get(c, "")) for c in cols])
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


def _plain_usage(pieces: list[str]) -> list[str]:
    # Typer ≥ 0.2x writes a required argument as `{bmc}`; a usage line reads `BMC`.
    return [p[1:-1].upper() if p.startswith("{") and p.endswith("}") else p for p in pieces]


class Verb(TyperCommand):
    """A command whose usage line names its arguments like every other CLI (``BMC``)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _plain_usage(super().collect_usage_pieces(ctx))


class VerbGroup(TyperGroup):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _plain_usage(super().collect_usage_pieces(ctx))


class App(typer.Typer):
    """``typer.Typer`` whose commands and groups are :class:`Verb` / :class:`VerbGroup`."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("cls", VerbGroup)
        super().__init__(**kw)

    def command(self, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
        kw.setdefault("cls", Verb)
        return super().command(*args, **kw)
