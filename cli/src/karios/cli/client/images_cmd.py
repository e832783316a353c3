"""``karios images``: the OS image catalog (register, list, show, delete)."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from karios.cli.client.api import CliError
from karios.cli.client.shared import App, api, emit, table

images_app = App(help="the OS image catalog: register (by URL, with its checksum), list, show, delete")
COLS = ["name", "state", "format", "served_format", "size_bytes", "disk_bytes", "message"]
Name = Annotated[str, typer.Argument(help="the image's name")]


@images_app.command("list")
def images_list() -> None:
    """Every image of the catalog: its state and what is served."""
    with api() as a:
        r = a.get("/controlnode/images")
    emit(r, table("images", r["items"], COLS))


@images_app.command("show")
def images_show(name: Name) -> None:
    """One image: state, source, checksums, what is served (path, sha256, sizes)."""
    with api() as a:
        r = a.get(f"/controlnode/images/{name}")
    emit(r, table(name, [r], [*COLS[:4], "path", "served_sha256", "source_url"]))


@images_app.command("register")
def images_register(
    name: Name,
    url: Annotated[str, typer.Argument(help="http(s) URL the provisioner downloads it from")],
    fmt: Annotated[str, typer.Option("--format", help="raw | raw.zst | raw.xz | raw.gz | qcow2 | tar.zst")],
    sha256: Annotated[str, typer.Option(help="the source's SHA-256 (or --sha512)")] = "",
    sha512: Annotated[str, typer.Option(help="the source's SHA-512 (or --sha256)")] = "",
    os_family: Annotated[str, typer.Option(help="debian, ubuntu, rhel, … or other")] = "other",
    wait: Annotated[bool, typer.Option(help="wait until it is ready or failed (exit 1 if failed)")] = True,
) -> None:
    """Register an image: downloaded and checked by the provisioner, qcow2/raw converted once."""
    body: dict[str, Any] = {"name": name, "source_url": url, "format": fmt, "os_family": os_family}
    body |= {k: v for k, v in (("sha256", sha256), ("sha512", sha512)) if v}
    with api() as a:
        r = a.post("/controlnode/images", json=body)
        while wait and r.get("state") == "registering":
            time.sleep(1.0)
            r = a.get(f"/controlnode/images/{name}")
    emit(r, table(name, [r], COLS))
    if r.get("state") == "failed":
        raise CliError(f"image {name}: {r.get('message', 'failed')}")


@images_app.command("delete")
def images_delete(name: Name) -> None:
    """Remove an image from the catalog (its served file too)."""
    with api() as a:
        r = a.delete(f"/controlnode/images/{name}")
    emit(r, table("deleted", [r], ["name", "state"]))
    sys.stdout.flush()
