"""``karios`` — run the system (``up``, ``run``, ``ready``, documents) and drive it (client verbs).

The server verbs start processes on this machine; the client verbs (``karios.cli.client``) talk
to a gateway's REST API with the client context ``karios up`` / ``karios login`` wrote.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from types import SimpleNamespace
from typing import Annotated

import typer

from karios.cli.backup import register as register_backup
from karios.cli.client import audit_cmd, commands, images_cmd, server_cmd
from karios.cli.client.api import CliError
from karios.cli.client.fabric_cmds import fabric_app
from karios.cli.client.shared import STATE, App
from karios.cli.demo.command import demo
from karios.cli.services import SERVICES

app = App(
    name="karios",
    help="Karios control plane: run it (up, run) and drive it (provision, jobs, fabric, …).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
ServiceName = StrEnum("ServiceName", {n.replace("-", "_"): n for n in sorted(SERVICES)})  # type: ignore[misc]


class Output(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"


@app.callback()
def root(
    output: Annotated[
        Output,
        typer.Option(
            "--output",
            "-o",
            help="table (default; ids shortened on a terminal), wide (full ids), json for scripts",
        ),
    ] = Output.table,
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            metavar="NAME",
            envvar="KARIOS_CONTEXT",
            help="the client context to use (~/.config/karios/contexts/NAME.json; default: config.json)",
        ),
    ] = None,
) -> None:
    """Karios control plane: run it (up, run) and drive it (provision, jobs, fabric, …)."""
    STATE["output"] = output.value
    STATE["context"] = context


def _service_replicas(values: list[str] | None) -> list[str] | None:
    """``--service-replicas`` checked while the command line is parsed (a usage error naming the
    option and the services); ``up`` parses the checked values again."""
    from karios.cli.up import parse_service_replicas

    try:
        parse_service_replicas(values or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return values


@app.command()
def up(
    timeout: Annotated[float, typer.Option(help="seconds to wait for every service to be ready")] = 90.0,
    max_crashes: Annotated[
        int,
        typer.Option(
            help="give up (stop everything) when one service crashes this often within --crash-window"
        ),
    ] = 5,
    crash_window: Annotated[float, typer.Option(help="seconds (see --max-crashes)")] = 60.0,
    otlp_endpoint: Annotated[
        str | None, typer.Option(help="send every service's traces to this OTLP/HTTP collector URL")
    ] = None,
    cluster: Annotated[
        int,
        typer.Option(min=0, max=9, help="run a JetStream cluster of this many nats-servers (3: streams R3)"),
    ] = 0,
    replicas: Annotated[
        int, typer.Option(min=0, max=9, help="processes of every service (default: 2 with --cluster, else 1)")
    ] = 0,
    service_replicas: Annotated[
        list[str] | None,
        typer.Option(
            "--service-replicas",
            metavar="SERVICE=N",
            callback=_service_replicas,
            help="processes of one service instead of --replicas (repeatable; N 1-9; SERVICE: "
            + ", ".join(SERVICES)
            + "), e.g. --service-replicas provisioner=3",
        ),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            metavar="NAME",
            help="keep the client context under this name (default: --context/KARIOS_CONTEXT, else "
            "the state directory's name); also written as the default context",
        ),
    ] = None,
) -> None:
    """Run the whole system on this machine (embedded NATS + PostgreSQL)."""
    from karios.cli.client.context import check_name
    from karios.cli.up import Up, parse_service_replicas, state_dir

    if context or STATE.get("context"):
        check_name(context or STATE["context"])  # before anything starts, not once all is ready
    args = SimpleNamespace(
        timeout=timeout,
        max_crashes=max_crashes,
        crash_window=crash_window,
        otlp_endpoint=otlp_endpoint,
        cluster=cluster,
        replicas=replicas,
        service_replicas=parse_service_replicas(service_replicas or []),
        context=context or STATE.get("context"),
    )
    raise typer.Exit(Up(args, state_dir()).run())


class HttpServer(StrEnum):
    uvicorn = "uvicorn"
    granian = "granian"


@app.command()
def run(
    service: Annotated[ServiceName, typer.Argument(help="the service to run")],
    port: Annotated[int | None, typer.Option(help="listen port (default: the service's setting)")] = None,
    server: Annotated[
        HttpServer | None,
        typer.Option(
            envvar="KARIOS_RUN_SERVER",
            help="HTTP server of the services other than bootapi (bootapi: BOOTAPI_SERVER); "
            "default: granian for the api-gateway, uvicorn for the others",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run one service (how production runs it)."""
    from karios.cli.runservice import run_service

    run_service(service.value, port, server.value if server else None)


@app.command()
def ready(
    service: Annotated[ServiceName, typer.Argument(help="the service to check")],
    timeout: Annotated[float, typer.Option(help="seconds")] = 2.0,
) -> None:
    """Exit 0 if a service on this host is ready (/readyz answers 200; container health checks)."""
    from karios.cli.readiness import ready as check

    raise typer.Exit(check(service.value, timeout))


@app.command()
def openapi(service: Annotated[ServiceName, typer.Argument(help="the service")]) -> None:
    """Print a service's OpenAPI document (docs/openapi/<service>.json)."""
    from karios.common.settings import KariosSettings

    spec = SERVICES[service.value]
    module = __import__(spec.module, fromlist=["create_app"])
    print(json.dumps(module.create_app(KariosSettings(dev_mode=True)).openapi(), indent=2, sort_keys=True))


@app.command()
def asyncapi() -> None:
    """Print the bus's AsyncAPI document (docs/asyncapi.json)."""
    from karios.common.contracts.asyncapi import build_document

    print(json.dumps(build_document(), indent=2, sort_keys=True))


@app.command("config-doc")
def config_doc() -> None:
    """Print docs/configuration.md (every setting of every service)."""
    from karios.cli.configdoc import render

    print(render(), end="")


# The verbs of the sub-modules, registered here (in this order: --help lists them so); none of
# them imports this module back.
app.command()(commands.login)
app.add_typer(commands.nodes_app, name="nodes")
app.add_typer(server_cmd.server_app, name="server")
app.command()(commands.provision)
app.command()(commands.unprovision)
app.command()(commands.jobs)
app.command()(commands.events)
app.add_typer(commands.job_app, name="job")
app.add_typer(fabric_app, name="fabric")
app.add_typer(commands.token_app, name="token")
app.add_typer(images_cmd.images_app, name="images")
app.command("audit")(audit_cmd.audit)
app.add_typer(commands.context_app, name="context")
app.command("demo")(demo)
register_backup(app)  # backup, restore


def main(argv: list[str] | None = None) -> int:
    try:
        # Without standalone mode click returns a typer.Exit's code instead of exiting.
        rv = app(args=argv, prog_name="karios", standalone_mode=False)
        if isinstance(rv, int):
            return rv
    except CliError as exc:
        print(f"karios: {exc.message}", file=sys.stderr)
        return exc.code
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        print("karios: aborted", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # usage errors and the like: one line, no stack trace
        # Typer ≥ 0.2x carries its own click (typer._click): its ClickException is a TyperException,
        # not click's — catching click.ClickException let every usage error end in a traceback.
        show = getattr(exc, "show", None)
        if isinstance(exc, typer.TyperException) and callable(show):
            show()
            return int(getattr(exc, "exit_code", 2))
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
