"""``karios demo``: ``karios up`` plus emulated BMCs wired to a demo inventory, so that a newcomer
provisions a fake server and watches it in the CLI and the console within a minute.

The demo servers' BMCs get documentation addresses (192.0.2.11, .12, …: TEST-NET-1, never a real
host) in the demo inventory; one sushy-emulator on 127.0.0.1 serves them all, and
``KARIOS_PROVISIONER_BMC_ENDPOINTS`` (written by the demo) maps each address to its emulated system.
The address is the BMC's key, so several servers cannot all be 127.0.0.1 (see docs/cli.md).

``karios demo --fabric`` (root) also builds a 3-node FRR fabric in network namespaces with a route
reflector (:mod:`karios.cli.demo.lab`), adopts the nodes through the gateway and stores a fabric
configuration for them (:mod:`karios.cli.demo.config`, :mod:`karios.cli.demo.adopt`); stopping the
demo removes every namespace, link and process it created.

``karios demo --vm`` (root) makes the first demo server a real qemu VM behind its emulated BMC
(:mod:`karios.cli.demo.vm`): ``karios provision … --method image --watch`` follows the whole image
install to the installed system's first boot; the VM's serial console is a log to tail.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Annotated

import typer
import yaml

from karios.cli.demo.adopt import adopt_and_configure
from karios.cli.demo.bmc import DemoBmcs
from karios.cli.demo.config import (
    DEMO_LAB_FILE,
    DEMO_VNIS,
    demo_fabric_config,
    demo_lab,
    demo_unavailable,
    demo_worker_env,
    describe,
)
from karios.cli.demo.topology import FABRIC_IP
from karios.cli.demo.vm import (
    DISK_GB,
    DISK_NAME,
    DemoVm,
    default_images_dir,
    ensure_images,
    guest_routes,
    make_disk,
    qemu_spec,
    vm_unavailable,
)
from karios.cli.up import Up, state_dir

BMC_BASE = "192.0.2."  # TEST-NET-1 (RFC 5737): documentation addresses


def demo_bmc_ips(count: int) -> list[str]:
    return [f"{BMC_BASE}{10 + i}" for i in range(1, count + 1)]


def demo_inventory(
    bmc_ips: list[str], systems: list[dict[str, object]], vm_servers: int = 0
) -> dict[str, object]:
    """The YAML inventory of the demo servers (two disks each; the NIC the emulator reports). The
    first ``vm_servers`` are VMs (``--vm``): the one virtio disk their qemu has."""
    devices = []
    for n, (ip, system) in enumerate(zip(bmc_ips, systems, strict=True), 1):
        macs = [str(nic["mac"]) for nic in system["nics"]]  # type: ignore[attr-defined]
        disks = [{"name": "sda", "size_gb": 100}, {"name": "sdb", "size_gb": 100}]
        if n <= vm_servers:
            disks = [{"name": DISK_NAME, "size_gb": DISK_GB}]
        devices.append(
            {
                "id": n,
                "name": f"demo-{n}",
                "oob_ip": ip,
                "interfaces": [{"name": "eno1", "macs": macs}],
                "disks": disks,
            }
        )
    return {"devices": devices}


class Demo(Up):
    """``karios up`` whose start-up also starts the emulated BMCs and whose stop stops them."""

    def __init__(self, args: argparse.Namespace, state: Path) -> None:
        super().__init__(args, state)
        self.bmc_ips = demo_bmc_ips(args.servers)
        self.gateway_url = ""
        self.bmcs = DemoBmcs(state / "demo-bmcs", count=args.servers, executable=args.sushy_emulator)
        self.lab = demo_lab() if getattr(args, "fabric", False) else None
        self.adopted: list[dict[str, object]] = []
        self.vm_dir = state / "vm" if getattr(args, "vm", False) else None
        self.vm: DemoVm | None = None
        if self.vm_dir is not None:
            self.bmcs.vm_spec = self.vm_dir / "vms.json"

    def _start_backends(self) -> None:
        if self.vm_dir is not None:
            self._prepare_images()  # before anything runs: minutes on a fresh machine
        super()._start_backends()
        self.bmcs.start()
        inventory = self.state / "demo-inventory.yaml"
        vms = 1 if self.vm_dir is not None else 0
        inventory.write_text(
            yaml.safe_dump(demo_inventory(self.bmc_ips, self.bmcs.systems, vms), sort_keys=False)
        )
        self.env.update(
            {
                "KARIOS_INVENTORY_FILE": str(inventory),
                "KARIOS_PROVISIONER_BMC_ENDPOINTS": self.bmcs.endpoints(self.bmc_ips),
                # No image to build: the Debian installer's netboot files (a Debian package).
                "KARIOS_PROVISIONER_INSTALL_METHOD": "preseed",
            }
        )
        from karios.provisioner.media import netboot_dir

        if self.lab is not None:
            self._start_fabric()
        if self.vm_dir is not None:
            # The image install (no Debian installer needed): the VM installs, a fake waits at booting.
            self.env["KARIOS_PROVISIONER_INSTALL_METHOD"] = "image"
            return
        if not (netboot_dir("12") / "linux").exists():
            print(
                "karios demo: the Debian installer is missing, a provision will fail at 'building': "
                "apt-get install debian-installer-12-netboot-amd64",
                file=sys.stderr,
            )

    def _prepare_images(self) -> None:
        """The image install's artifacts, built once into the user's cache (or
        ``KARIOS_PROVISIONER_IMAGES_DIR``) through the image mirror / proxy settings."""
        from karios.cli.demo.bmc import cache_dir
        from karios.provisioner.config import ProvisionerConfig
        from karios.provisioner.install.live import ImageSettings, live_images_for

        given = os.environ.get("KARIOS_PROVISIONER_IMAGES_DIR")
        images_dir = Path(given) if given else default_images_dir(cache_dir())
        cfg = ProvisionerConfig(images_dir=images_dir)
        self.env["KARIOS_PROVISIONER_IMAGES_DIR"] = str(images_dir)
        built = ensure_images(
            live_images_for(cfg, ImageSettings.from_config(cfg)), lambda line: print(line, flush=True)
        )
        if built is not None and not given:  # images of older keys (another Karios version): dead weight
            for old in images_dir.parent.iterdir():
                if old.is_dir() and old != images_dir:
                    shutil.rmtree(old, ignore_errors=True)

    def _start_vm(self, urls: dict[str, str]) -> None:
        """The first demo server's VM, once the services' ports are known: a blank sparse disk,
        the spec the emulator boots it from, the guest's URLs for the provisioner."""
        assert self.vm_dir is not None and self.bmcs.vm_spec is not None
        routes = guest_routes(urls["api-gateway"], urls["provisioner"])
        system = self.bmcs.systems[0]
        mac = str(system["nics"][0]["mac"])  # type: ignore[index]
        self.vm = DemoVm(str(system["uuid"]), mac, self.vm_dir, guestfwd=routes.guestfwd)
        make_disk(self.vm.disk, self.vm.disk_gb)
        self.vm.serial_log.touch()
        self.bmcs.vm_spec.write_text(json.dumps({self.vm.system_uuid: qemu_spec(self.vm)}, indent=1))
        self.env.update(routes.env)

    def _start_fabric(self) -> None:
        """The lab before the services start (the fabric worker gets the demo's VNIs and reaches
        the nodes through the lab's host link)."""
        assert self.lab is not None
        print("karios demo: building the fabric lab (3 FRR nodes + route reflector)…", flush=True)
        self.lab.start()
        (self.state / DEMO_LAB_FILE).write_text(json.dumps(describe(self.lab), indent=1))
        self.env.update(demo_worker_env())

    def shutdown(self, *_a: object) -> None:
        first = not self.stopping
        super().shutdown()  # the services first: the fabric worker may be in an SSH session
        if first:
            self.bmcs.stop()
            if self.lab is not None:
                self.lab.stop()  # every namespace (and what runs in it), the host link, the workdir
                (self.state / DEMO_LAB_FILE).unlink(missing_ok=True)
                print("karios demo: fabric lab removed", flush=True)

    def _supervise(self) -> int:
        if self.lab is not None:
            try:
                self.adopted = adopt_and_configure(self.lab, self.gateway_url, self.admin_token)
            except RuntimeError as exc:
                print(f"karios demo: {exc}", file=sys.stderr, flush=True)
                self.shutdown()
                return 1
        self._print_demo()
        return super()._supervise()

    def _print_demo(self) -> None:
        gw = self.gateway_url
        # With --vm the first server is the VM: the emulated-only advice names the next one.
        fake = self.bmc_ips[1] if self.vm is not None and len(self.bmc_ips) > 1 else self.bmc_ips[0]
        lines = [
            f"\nkarios demo: {len(self.bmc_ips)} emulated servers "
            f"(sushy-tools at {self.bmcs.url}, log {self.bmcs.log_path})",
            *(
                f"  BMC {ip:13s} {s['name']}  Redfish system {s['uuid']}"
                for ip, s in zip(self.bmc_ips, self.bmcs.systems, strict=True)
            ),
            "Try:",
            f"  karios provision {fake} --watch --until booting",
            "  karios jobs",
            "  karios job cancel JOB_ID   (an emulated server runs no installer: its job waits at booting)",
        ]
        if gw and _answers(f"{gw}/console/login"):
            lines.append(f"  console: {gw}/console  (log in with the admin token above)")
        if self.lab is not None:
            lines += self._fabric_lines(gw)
        if self.vm is not None:
            lines += self._vm_lines()
        print("\n".join(lines), flush=True)

    def _vm_lines(self) -> list[str]:
        assert self.vm is not None
        return [
            f"\nkarios demo --vm: {self.bmc_ips[0]} demo-1 is a qemu VM (TCG, {self.vm.memory_mib} MiB, "
            f"disk {DISK_NAME} {self.vm.disk_gb} GiB sparse: {self.vm.disk})",
            f"  serial console: tail -f {self.vm.serial_log}",
            "Install it (the image method; about 4-10 minutes under TCG):",
            f"  karios provision {self.bmc_ips[0]} --method image --hostname demo-vm --watch",
        ]

    def _fabric_lines(self, gw: str) -> list[str]:
        assert self.lab is not None
        cfg = demo_fabric_config()
        vnis = ",".join(str(v) for v in DEMO_VNIS)
        return [
            f"\nkarios demo --fabric: {len(self.lab.nodes)} nodes in network namespaces, adopted with "
            f"their SSH key; route reflector (FRR) at {FABRIC_IP} in {self.lab.fabric_netns}",
            *(
                f"  {n.name}  {n.underlay_ip:13s} netns {n.netns}  host key {n.host_key_fingerprint}"
                for n in self.lab.nodes
            ),
            f"  fabric config stored: AS {cfg['as']}, VNIs {vnis}, peer {cfg['fabric_switch_peering_ip']} "
            "(the route reflector)",
            "Next:",
            "  karios fabric apply --watch      (shows each node's diff, asks, rolls EVPN out)",
            f"  console: {gw}/console/fabric",
        ]

    def _add_services(self) -> tuple[str, dict[str, str]]:
        host, urls = super()._add_services()
        self.gateway_url = urls["api-gateway"]
        if self.vm_dir is not None:
            self._start_vm(urls)  # the services start after this: they get the guest's URLs
        return host, urls


def _answers(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=3) as r:  # noqa: S310
        return bool(r.status == 200)
    return False


def demo(
    servers: Annotated[int, typer.Option(min=1, max=50, help="how many emulated servers")] = 3,
    sushy_emulator: Annotated[
        str | None, typer.Option(help="a sushy-emulator executable (default: PATH, else a cached venv)")
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for every service to be ready")] = 90.0,
    fabric: Annotated[
        bool,
        typer.Option(
            "--fabric", help="(root) also a 3-node FRR fabric in network namespaces, adopted and configured"
        ),
    ] = False,
    vm: Annotated[
        bool,
        typer.Option(
            "--vm", help="(root) the first server is a qemu VM: provision installs it to its first boot"
        ),
    ] = False,
) -> None:
    """`karios up` with emulated BMCs (sushy-tools) and a demo inventory: provision a fake server."""
    args = argparse.Namespace(
        timeout=timeout,
        max_crashes=5,
        crash_window=60.0,
        servers=servers,
        sushy_emulator=sushy_emulator,
        fabric=fabric,
        vm=vm,
    )
    state = state_dir() / "demo"
    if vm:
        reason = "one at a time with --fabric (each takes a core)" if fabric else vm_unavailable()
        if reason:
            print(f"karios demo --vm: {reason}", file=sys.stderr)
            raise typer.Exit(2)
        # A blank server each run (new system, new disk): its own state dir, started empty, so no
        # job of an earlier run holds the BMC.
        state = state_dir() / "demo-vm"
        if os.environ.get("KARIOS_DATABASE_URL"):
            print(
                "karios demo --vm: uses its own embedded PostgreSQL; unset KARIOS_DATABASE_URL",
                file=sys.stderr,
            )
            raise typer.Exit(2)
        shutil.rmtree(state, ignore_errors=True)
    if fabric:
        reason = demo_unavailable()
        if reason:
            print(f"karios demo --fabric: {reason}", file=sys.stderr)
            raise typer.Exit(2)
        # The lab is new on every run (new host keys): its own state dir, started empty, so no pin,
        # VTEP or job of an earlier run's nodes is in the way.
        state = state_dir() / "demo-fabric"
        if os.environ.get("KARIOS_DATABASE_URL"):
            print(
                "karios demo --fabric: uses its own embedded PostgreSQL; unset KARIOS_DATABASE_URL",
                file=sys.stderr,
            )
            raise typer.Exit(2)
        shutil.rmtree(state, ignore_errors=True)
    try:
        code = Demo(args, state).run()
    except (RuntimeError, TimeoutError) as exc:  # a lab or emulator that did not come up: one message
        print(f"karios demo: {exc}", file=sys.stderr)
        code = 1
    raise typer.Exit(code)
