"""``karios fabric set`` and the switch re-configuration ack gate (docs/fabric.md).

A change of the switch's configuration answers 409 ``REQUIRES_SWITCH_RECONFIG_ACK``
with one snippet per NOS (``details.snippets[]``: snippet, diff, verify, hash). The CLI shows the
snippet of the switch's NOS (``details.switch_nos``; ``--all-nos``: every NOS), its hash, and the
exact command to run once the switch has it: the same ``karios fabric set …`` plus ``--ack HASH
--acked-by NAME`` (which sends ``switch_acked``, ``switch_snippet_hash`` and ``acked_by``). It
exits :data:`ACK_EXIT` (the change is not stored).
"""

from __future__ import annotations

import getpass
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from karios.cli.client.api import CliError

ACK_CODE = "REQUIRES_SWITCH_RECONFIG_ACK"
#: Exit code of ``karios fabric set`` when the switch must be re-configured and acknowledged.
ACK_EXIT = 5
#: Body fields the ack options set (dropped from key=value pairs when the re-run command is built).
_ACK_FIELDS = ("switch_acked", "switch_snippet_hash", "acked_by", "skip_switch_ack")


def ack_fields(ack: str, acked_by: str, skip: bool) -> dict[str, Any]:
    """The body fields of ``--ack HASH --acked-by NAME`` / ``--skip-switch-ack``."""
    out: dict[str, Any] = {}
    if ack:
        if not acked_by.strip():
            raise CliError("--ack needs --acked-by NAME (who applied the switch snippet; audit log)")
        out |= {"switch_acked": True, "switch_snippet_hash": ack.strip(), "acked_by": acked_by.strip()}
    elif acked_by.strip():
        out["acked_by"] = acked_by.strip()  # recorded with --skip-switch-ack
    if skip:
        out["skip_switch_ack"] = True
    return out


def needs_ack(err: CliError) -> dict[str, Any] | None:
    """The 409 body when `err` is the ack gate's answer, else None."""
    body = err.body
    if err.status == 409 and isinstance(body, dict) and body.get("code") == ACK_CODE:
        return body
    return None


def _who(acked_by: str) -> str:
    if acked_by.strip():
        return acked_by.strip()
    try:
        return getpass.getuser() or "NAME"
    except (OSError, KeyError):
        return "NAME"


def rerun_command(pairs: list[str], file: Path | None, *, nos: str, digest: str, acked_by: str) -> str:
    """``karios fabric set`` with the same fields, ``switch_nos=NOS`` when `nos` is set, and the ack."""
    keep = [p for p in pairs if p.partition("=")[0] not in (*_ACK_FIELDS, *(("switch_nos",) if nos else ()))]
    args = ["karios", "fabric", "set", *keep]
    if nos:
        args.append(f"switch_nos={nos}")
    if file is not None:
        args += ["--file", str(file)]
    args += ["--ack", digest, "--acked-by", _who(acked_by)]
    return shlex.join(args)


def _section(out: Console, s: dict[str, Any], *, default: bool, rerun: str) -> None:
    nos = s.get("nos", "?")
    out.out(f"== {nos}{' (the switch NOS of this configuration)' if default else ''} ==")
    out.out(f"[{nos}] paste on the switch:")
    out.out(str(s.get("snippet", "")).rstrip("\n"))
    out.out(f"[{nos}] diff of the switch configuration:")
    out.out(str(s.get("diff", "")).rstrip("\n"))
    out.out(f"[{nos}] verify with: {s.get('verify', '')}")
    out.out(f"[{nos}] switch_snippet_hash: {s.get('switch_snippet_hash', '')}")
    out.out(f"[{nos}] once the switch runs it, re-run:")
    out.out(f"  {rerun}")
    out.out("")


def _what_changes(d: dict[str, Any]) -> str:
    old, new = d.get("old_listen_range", "?"), d.get("new_listen_range", "?")
    moves = f"its BGP listen range moves from {old} to {new}" if old and new and old != new else ""
    fields = d.get("changed_fields")
    if not fields:  # a server from before issue 23 item 6 gates listen-range moves only
        return moves or f"its BGP listen range moves from {old} to {new}"
    what = f"its configuration changes with {', '.join(map(str, fields))}"
    return f"{what}; {moves}" if moves else what


def show_ack_needed(
    body: dict[str, Any],
    out: Console,
    *,
    pairs: list[str],
    file: Path | None,
    all_nos: bool,
    acked_by: str,
    as_json: bool,
) -> CliError:
    """Print what the switch needs (or the 409's JSON) and return the error to exit with."""
    message = f"{body.get('message', '')} ({ACK_CODE})"
    if as_json:
        sys.stdout.write(json.dumps(body, indent=2, default=str) + "\n")
        return CliError(message, ACK_EXIT)
    d = body.get("details") or {}
    default_nos = d.get("switch_nos", "")
    snippets = [s for s in d.get("snippets") or [] if isinstance(s, dict)]
    shown = [s for s in snippets if all_nos or s.get("nos") == default_nos] or snippets
    field = f" ({body['field']})" if body.get("field") else ""
    out.out(f"The fabric switch must be re-configured first: {_what_changes(d)}{field}. Nothing was stored.")
    out.out("")
    for s in shown:
        default = s.get("nos") == default_nos
        rerun = rerun_command(
            pairs, file, nos="" if default else s.get("nos", ""), digest=s.get("switch_snippet_hash", ""),
            acked_by=acked_by,
        )  # fmt: skip
        _section(out, s, default=default, rerun=rerun)
    others = sorted(s.get("nos", "") for s in snippets if s not in shown)
    if others:
        out.out(f"Snippets for other switch OS ({', '.join(others)}): add --all-nos.")
    out.out("--acked-by names who applied the snippet (kept in the switch-ack audit log).")
    return CliError(message, ACK_EXIT)
