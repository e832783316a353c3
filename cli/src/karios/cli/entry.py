"""The ``karios`` command's entry point.

``karios ready <service>`` is a container health check: Docker runs it every few seconds in every
replica. Through the full CLI (Typer, the client verbs, pydantic settings) one check cost ~0.45 s
of CPU — ten replicas checked every 5 s took most of a 2-core machine (measured on the compose
topology, docs/operations.md). Here it answers with the standard library alone (~0.03 s), with
the same output and exit status; every other verb, ``--help`` and any option this parser does not
know load the full CLI (:mod:`karios.cli.main`). The readiness check itself is
:mod:`karios.cli.readiness`; nothing below imports this module back.
"""

from __future__ import annotations

import sys

from karios.cli.readiness import READY_PORTS, ready


def _ready_args(argv: list[str]) -> tuple[str, float] | None:
    """``ready SERVICE [--timeout S]`` → (service, timeout); None for anything else."""
    if len(argv) < 2 or argv[0] != "ready" or argv[1] not in READY_PORTS:
        return None
    rest, timeout = argv[2:], 2.0
    if rest:
        value = rest[1] if len(rest) == 2 and rest[0] == "--timeout" else None
        if len(rest) == 1 and rest[0].startswith("--timeout="):
            value = rest[0].split("=", 1)[1]
        try:
            timeout = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None  # the full CLI says what is wrong with it
        if not timeout > 0:
            return None
    return argv[1], timeout


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if (parsed := _ready_args(args)) is not None:
        return ready(*parsed)
    from karios.cli.main import main as full

    return full(args)
