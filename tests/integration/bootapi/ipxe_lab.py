"""Boot a qemu VM's NIC iPXE ROM against bootapi, both inside one private network namespace.

Run as ``unshare -n python -m tests.integration.bootapi.ipxe_lab OUT.json MAC [MAC...]`` (root):
brings ``lo`` up, serves bootapi (fixed host table, no bus) plus a ``/marker/{name}`` route on
127.0.0.1, boots one VM per MAC (qemu user networking reaches the host's loopback as 10.0.2.2),
and writes what bootapi saw and each VM's serial console to OUT.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import uvicorn

from karios.bootapi.app import create_app
from karios.bootapi.settings import BootapiSettings
from karios.common.settings import KariosSettings
from tests.fixtures.bootapi_hosts import FixedHosts
from tests.fixtures.wait import wait_until

BOOT_TIMEOUT = 90.0


def template_set_with_markers(root: Path) -> Path:
    """The default templates, with a catalog whose kernel/initrd are marker URLs on bootapi."""
    from shutil import copytree

    from karios.common.oscatalog import default_set_dir

    d = root / "set"
    copytree(default_set_dir(), d)
    (d / "catalog/almalinux-9.yaml").write_text(
        "platforms: [almalinux-9]\ninstaller: kickstart\ntemplate: kickstart/almalinux-9.ks.j2\n"
        "repo: http://10.0.2.2:{port}/marker/\nkernel: vmlinuz\ninitrd: [initrd.img]\nargs: [ip=dhcp]\n"
    )
    return d


async def boot(mac: str, port: int, workdir: Path) -> tuple[str, asyncio.subprocess.Process]:
    log = workdir / f"serial-{mac.replace(':', '')}.log"
    proc = await asyncio.create_subprocess_exec(
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-machine",
        "graphics=off",
        "-m",
        "128",
        "-display",
        "none",
        "-no-reboot",
        "-serial",
        f"file:{log}",
        "-netdev",
        f"user,id=n0,bootfile=http://10.0.2.2:{port}/ipxe/{mac}",
        "-device",
        f"virtio-net-pci,netdev=n0,mac={mac}",
        "-boot",
        "n",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    return str(log), proc


async def main(out: Path, macs: list[str]) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = Path(tempfile.mkdtemp(prefix="bootapi-ipxe-"))
    tset = template_set_with_markers(work)
    catalog = tset / "catalog/almalinux-9.yaml"
    catalog.write_text(catalog.read_text().replace("{port}", str(port)))
    seen: list[str] = []
    app = create_app(
        KariosSettings(dev_mode=True, log_json=False),
        BootapiSettings(_env_file=None, template_dir=tset, base_url=f"http://10.0.2.2:{port}"),  # type: ignore[call-arg]
        host_source=FixedHosts(),
    )

    @app.get("/marker/{name}")
    async def marker(name: str) -> str:
        return f"marker {name}"

    async def record(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            seen.append(
                scope["path"] + ("?" + scope["query_string"].decode() if scope["query_string"] else "")
            )
        await app(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(record, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started, timeout=30, what="the recording bootapi to start")
    results = {}
    for mac in macs:
        log, proc = await boot(mac, port, work)
        want = "Karios: installing" if mac == macs[0] else "local disk not bootable"

        def finished(mac: str = mac, want: str = want, log: str = log, proc=proc) -> bool:  # type: ignore[no-untyped-def]
            text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
            if mac == macs[0]:  # the installer path: its kernel and initrd were fetched
                done = any(p.startswith("/marker/initrd") for p in seen) and want in text
            else:
                done = want in text
            return done or proc.returncode is not None

        with contextlib.suppress(AssertionError):  # the test reads what was seen and logged
            await wait_until(finished, timeout=BOOT_TIMEOUT, interval=0.25, what=f"{mac} to boot")
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
        results[mac] = {
            "serial": Path(log).read_text(errors="replace") if Path(log).exists() else "",
            "qemu_stderr": err[-2000:],
        }
    server.should_exit = True
    await task
    out.write_text(json.dumps({"port": port, "seen": seen, "boots": results}, indent=2))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2:]))
