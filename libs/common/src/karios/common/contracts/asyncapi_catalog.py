"""Who sends and who receives each bus contract, on which subject: the facts the AsyncAPI
operations are generated from (:mod:`karios.common.contracts.asyncapi`).

Addresses are built with :class:`~karios.common.bus.subjects.Subjects`, the same builder the
services publish with; a parameter is a sentinel token (``param("jobId")``) that the builder keeps
intact and the generator turns into ``{jobId}``. One example per event and command, made from the
contract model itself (so it validates), is published with the message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from karios.common.bus.deadletter import CommandFailed
from karios.common.bus.subjects import Subjects
from karios.common.contracts.base import Contract
from karios.common.contracts.discovery import ServerAdopted, ServerDiscovered
from karios.common.contracts.fabric_rollout import (
    DriftFinding,
    FabricDriftEvent,
    FabricRolloutEvent,
    JobType,
    StartFabricApply,
    StartFabricTeardown,
)
from karios.common.contracts.firmware import FirmwareComponentResult, FirmwareUpdateProgress
from karios.common.contracts.hardware import BmcCredentialsRotated, HardwareInspected, PowerStateChanged
from karios.common.contracts.inventory import DeviceChanged, NodeRegistered
from karios.common.contracts.nodes import ComputeNodeChanged
from karios.common.contracts.provision import JobProgress, ProvisionSpec, StartProvision

SUBJECTS = Subjects()  # the default prefix; the document says how another prefix changes it
_SENTINEL = re.compile(r"P0([A-Za-z]+)0P")


def param(name: str) -> str:
    """A subject token that :meth:`Subjects` keeps as is and :func:`address` makes ``{name}``."""
    return f"P0{name}0P"


def address(subject: str) -> str:
    return _SENTINEL.sub(r"{\1}", subject)


@dataclass(frozen=True)
class Parameter:
    description: str
    examples: tuple[str, ...] = ()
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class Route:
    """One channel: its subject (with parameters), the contracts it carries, who sends them
    and who receives them (service names as in ``karios run <service>``)."""

    channel: str
    subject: str
    description: str
    messages: tuple[type[Contract], ...]
    senders: dict[str, tuple[type[Contract], ...]]  # service → the contracts it sends here
    receivers: dict[str, str]  # service → how it receives (one line)
    parameters: dict[str, Parameter] = field(default_factory=dict)
    stream: str = ""  # the JetStream stream that stores the subject ("" core NATS)


_ENTITY_IP = "an IP address with dots as underscores (`10.0.0.1` → `10_0_0_1`)"
_ALL = "every event (`karios.evt.>`) for its SSE relay (ordered consumer)"

EVENT_ROUTES = (
    Route(
        "provisionJob",
        SUBJECTS.evt("provision", f"job.{param('state')}", param("jobId")),
        "Every transition and installer step of a provision or unprovision job.",
        (JobProgress,),
        {"provisioner": (JobProgress,), "api-gateway": (JobProgress,)},
        {
            "api-gateway": "durable pull consumer `gateway-provision-projector` of `karios.evt.provision.>` "
            "(job read model) + " + _ALL,
        },
        {
            "state": Parameter(
                "the job's state after the transition (`resumed`: another replica took the job over; "
                "`failed`/`cancelled` are also published by the gateway when it ends a job it lost)",
                ("queued", "building_media", "booting", "completed", "failed"),
            ),
            "jobId": Parameter(
                "the job id (a UUID: UUIDv4 today)", ("0192f6a4-5b1e-7c3d-8e9f-0a1b2c3d4e5f",)
            ),
        },
        stream="KARIOS_EVT",
    ),
    Route(
        "fabric",
        SUBJECTS.evt("fabric", param("state"), param("entity")),
        "Fabric jobs (apply / teardown, per node and per job) and the drift watch's findings.",
        (FabricRolloutEvent, FabricDriftEvent),
        {"fabric-worker": (FabricRolloutEvent, FabricDriftEvent)},
        {"api-gateway": _ALL + " (SSE event `fabric_switch`)"},
        {
            "state": Parameter(
                "the rollout state (`apply_started`, `node_connecting`, `node_ready`, `node_failed`, "
                "`apply_completed`, `teardown_completed`…) or `node_drifted` / `node_drift_cleared`",
                ("apply_started", "node_ready", "apply_completed", "node_drifted"),
            ),
            "entity": Parameter(f"the node's IP, {_ENTITY_IP}, or the job id", ("10_0_0_11",)),
        },
        stream="KARIOS_EVT",
    ),
    Route(
        "inventoryNodeRegistered",
        SUBJECTS.evt("inventory", "node.registered", param("bmcIp")),
        "A node was created or updated in the registry (`POST /controlnode/register`).",
        (NodeRegistered,),
        {"inventory": (NodeRegistered,)},
        {"api-gateway": _ALL},
        {"bmcIp": Parameter(f"the node's BMC IP, {_ENTITY_IP}", ("10_99_0_1",))},
        stream="KARIOS_EVT",
    ),
    Route(
        "inventoryComputeNode",
        SUBJECTS.evt("inventory", f"node.{param('change')}", param("nodeIp")),
        "A compute node joined (adopted / firstboot) or left the fabric's node set.",
        (ComputeNodeChanged,),
        {"inventory": (ComputeNodeChanged,)},
        {"api-gateway": _ALL},
        {
            "change": Parameter("what happened", enum=("adopted", "registered", "removed")),
            "nodeIp": Parameter(f"the node's IP, {_ENTITY_IP}", ("10_0_0_11",)),
        },
        stream="KARIOS_EVT",
    ),
    Route(
        "inventoryDeviceChanged",
        SUBJECTS.evt("inventory", "device.changed", param("device")),
        "NetBox (or the file inventory) changed a device; caches drop what they hold for it.",
        (DeviceChanged,),
        {"inventory": (DeviceChanged,)},
        {
            "inventory": "every replica, core subscription on `karios.evt.inventory.device.changed.*`",
            "bootapi": "every replica, core subscription on `karios.evt.inventory.device.changed.*`",
            "api-gateway": _ALL,
        },
        {"device": Parameter("the NetBox device id, or its name", ("42",))},
        stream="KARIOS_EVT",
    ),
    Route(
        "inventoryHardwareInspected",
        SUBJECTS.evt("inventory", "hardware.inspected", param("bmcIp")),
        "A server's hardware was read through its BMC (`POST /controlnode/bmc/{ip}/inspect`) and its "
        "hardware record replaced; a summary (the record: `GET /controlnode/bmc/{ip}/hardware`).",
        (HardwareInspected,),
        {"provisioner": (HardwareInspected,)},
        {
            "api-gateway": _ALL,
            "inventory": "durable pull consumer `inventory-writeback` (one replica per event), only "
            "with `KARIOS_INVENTORY_WRITEBACK` on: writes the record back to NetBox",
        },
        {"bmcIp": Parameter(f"the BMC IP, {_ENTITY_IP}", ("10_99_0_1",))},
        stream="KARIOS_EVT",
    ),
    Route(
        "inventoryServerDiscovered",
        SUBJECTS.evt("inventory", "server.discovered", param("bootMac")),
        "A machine no host owned PXE-booted the live environment in discovery mode "
        "(`BOOTAPI_DISCOVERY_ENABLED`) and reported its hardware: a new discovered server "
        "(`created`), or a known one whose report changed; a summary (the record: "
        "`GET /controlnode/discovered/{id}`).",
        (ServerDiscovered,),
        {"provisioner": (ServerDiscovered,)},
        {"api-gateway": _ALL},
        {"bootMac": Parameter("the MAC it PXE-booted from, `aa:bb:cc:dd:ee:ff`", ("52:54:00:12:34:56",))},
        stream="KARIOS_EVT",
    ),
    Route(
        "inventoryServerAdopted",
        SUBJECTS.evt("inventory", "server.adopted", param("bootMac")),
        "An operator adopted a discovered server (`POST /controlnode/discovered/{id}/adopt`); the "
        "NetBox device to create comes with the answer.",
        (ServerAdopted,),
        {"provisioner": (ServerAdopted,)},
        {"api-gateway": _ALL},
        {"bootMac": Parameter("the MAC it PXE-booted from, `aa:bb:cc:dd:ee:ff`", ("52:54:00:12:34:56",))},
        stream="KARIOS_EVT",
    ),
    Route(
        "provisionBmcCredentialsRotated",
        SUBJECTS.evt("provision", "bmc.credentials_rotated", param("bmcIp")),
        "A BMC account got a new random password, verified and stored encrypted "
        "(`POST /controlnode/bmc/{ip}/rotate-credentials`). Never carries the password.",
        (BmcCredentialsRotated,),
        {"provisioner": (BmcCredentialsRotated,)},
        {"api-gateway": _ALL},
        {"bmcIp": Parameter(f"the BMC IP, {_ENTITY_IP}", ("10_99_0_1",))},
        stream="KARIOS_EVT",
    ),
    Route(
        "provisionFirmwareProgress",
        SUBJECTS.evt("provision", "firmware.progress", param("bmcIp")),
        "A firmware update moved: state, percent, the BMC Task's state and messages; the last one "
        "carries the per-component versions before and after (`POST /controlnode/bmc/{ip}/firmware-update`).",
        (FirmwareUpdateProgress,),
        {"provisioner": (FirmwareUpdateProgress,)},
        {"api-gateway": _ALL},
        {"bmcIp": Parameter(f"the BMC IP, {_ENTITY_IP}", ("10_99_0_1",))},
        stream="KARIOS_EVT",
    ),
    Route(
        "provisionPowerChanged",
        SUBJECTS.evt("provision", "power.changed", param("bmcIp")),
        "A server's power state changed while no Karios job worked on it (seen by the periodic "
        "power sync, `KARIOS_PROVISIONER_POWER_SYNC_INTERVAL`): e.g. powered off by someone else.",
        (PowerStateChanged,),
        {"provisioner": (PowerStateChanged,)},
        {"api-gateway": _ALL},
        {"bmcIp": Parameter(f"the BMC IP, {_ENTITY_IP}", ("10_99_0_1",))},
        stream="KARIOS_EVT",
    ),
    Route(
        "commandFailed",
        SUBJECTS.evt(param("domain"), "command_failed", param("entity")),
        "A command was given up on (permanent error or retries exhausted) and dead-lettered.",
        (CommandFailed,),
        {"provisioner": (CommandFailed,), "fabric-worker": (CommandFailed,)},
        {
            "api-gateway": "durable pull consumer `gateway-provision-command-failed` of "
            "`karios.evt.provision.command_failed.*` (ends the job)"
        },
        {
            "domain": Parameter("the command's domain", enum=("provision", "fabric")),
            "entity": Parameter("the command's entity (its job id), else the command's id"),
        },
        stream="KARIOS_EVT",
    ),
)

COMMAND_ROUTES = (
    Route(
        "provisionStart",
        SUBJECTS.cmd("provision", "start"),
        "Start a provision or unprovision job (the gateway has validated it and written the job).",
        (StartProvision,),
        {"api-gateway": (StartProvision,)},
        {"provisioner": "durable pull consumer `provisioner-provision-start` (work queue)"},
        stream="KARIOS_CMD",
    ),
    Route(
        "fabricApply",
        SUBJECTS.cmd("fabric", "apply"),
        "Run a queued fabric apply job (sent by the replica that accepted `req.fabric.request_apply`).",
        (StartFabricApply,),
        {"fabric-worker": (StartFabricApply,)},
        {"fabric-worker": "durable pull consumer `fabric-worker-fabric-apply` (work queue)"},
        stream="KARIOS_CMD",
    ),
    Route(
        "fabricTeardown",
        SUBJECTS.cmd("fabric", "teardown"),
        "Remove the fabric from nodes (sent on `DELETE /controlnode/fabric-config`).",
        (StartFabricTeardown,),
        {"fabric-worker": (StartFabricTeardown,)},
        {"fabric-worker": "durable pull consumer `fabric-worker-fabric-teardown` (work queue)"},
        stream="KARIOS_CMD",
    ),
)

_JOB = "0192f6a4-5b1e-7c3d-8e9f-0a1b2c3d4e5f"

#: One example payload per event and command (validated by the model when this module loads).
EXAMPLES: dict[type[Contract], Contract] = {
    HardwareInspected: HardwareInspected(
        bmc_ip="10.99.0.1",
        inspected_at="2026-01-01T12:00:00+00:00",
        driver="dell",
        manufacturer="Dell Inc.",
        model="PowerEdge R750",
        serial="CNIVC0014M0388",
        power_state="On",
        processor_count=2,
        memory_total_gib=512,
        drive_count=3,
        nic_count=5,
        gpu_count=1,
        firmware_count=21,
    ),
    ServerDiscovered: ServerDiscovered(
        id="0192f6a4-7000-4000-8000-00000000d15c",
        boot_mac="b8:ce:f6:01:02:03",
        created=True,
        serial="7XK1MN3",
        manufacturer="Dell Inc.",
        model="PowerEdge R750",
        processor_threads=72,
        memory_mib=257614,
        drive_count=3,
        nic_count=3,
        gpu_count=1,
        ip="10.20.0.99",
    ),
    ServerAdopted: ServerAdopted(
        id="0192f6a4-7000-4000-8000-00000000d15c",
        boot_mac="b8:ce:f6:01:02:03",
        serial="7XK1MN3",
        hostname="r750-01",
        adopted_by="ops-alice",
    ),
    PowerStateChanged: PowerStateChanged(
        bmc_ip="10.99.0.1",
        previous="On",
        current="Off",
        change="powered_off",
        health="OK",
        observed_at="2026-01-01T12:05:00+00:00",
        previous_read_at="2026-01-01T12:00:00+00:00",
    ),
    BmcCredentialsRotated: BmcCredentialsRotated(
        bmc_ip="10.99.0.1",
        username="root",
        rotated_at="2026-01-01T12:00:00+00:00",
        verified_by="session",
        requested_by="admin",
    ),
    FirmwareUpdateProgress: FirmwareUpdateProgress(
        job_id="0192f6a4-7000-4000-8000-00000000f1a5",
        bmc_ip="10.99.0.1",
        state="succeeded",
        percent=100,
        task_state="Completed",
        message="Job completed successfully.",
        components=[
            FirmwareComponentResult(
                id="Installed-159-1.8.2__BIOS.Setup.1-1",
                name="BIOS",
                kind="bios",
                uri="/redfish/v1/UpdateService/FirmwareInventory/Installed-159-1.8.2__BIOS.Setup.1-1",
                version_before="1.8.2",
                version_after="1.9.0",
                outcome="updated",
            )
        ],
    ),
    JobProgress: JobProgress(
        job_id=_JOB,
        bmc_ip="10.99.0.1",
        state="booting",
        status="running",
        stage="Booting",
        percent=35,
        message="virtual media mounted, one reset sent",
        resource_name="node1",
    ),
    FabricRolloutEvent: FabricRolloutEvent(
        job_id=_JOB,
        job_type=JobType.APPLY,
        state="node_ready",
        progress=50,
        node_ip="10.0.0.11",
        fqdn="node1.example.net",
        message="FRR reloaded",
    ),
    FabricDriftEvent: FabricDriftEvent(
        state="node_drifted",
        node_ip="10.0.0.11",
        fqdn="node1.example.net",
        drifted=True,
        findings=[DriftFinding(kind="bgp session", message="10.255.0.254: Active")],
        message="1 finding",
        checked_at="2026-01-01T12:00:00+00:00",
    ),
    NodeRegistered: NodeRegistered(
        bmc_ip="10.99.0.1", created=True, hostname="node1", node_ip="10.0.0.11", vendor="dell"
    ),
    ComputeNodeChanged: ComputeNodeChanged(
        node_ip="10.0.0.11", change="adopted", hostname="node1", host_key_fingerprint="SHA256:Ab3x"
    ),
    DeviceChanged: DeviceChanged(device_id=42, name="node1", macs=["52:54:00:12:34:56"]),
    CommandFailed: CommandFailed(
        command_type=StartProvision.TYPE,
        command_id="0192f6a4-5b1e-7c3d-8e9f-0a1b2c3d4e60",
        code="BMC_UNREACHABLE",
        message="BMC 10.99.0.1 did not answer",
        deliveries=5,
    ),
    StartProvision: StartProvision(
        job_id=_JOB,
        spec=ProvisionSpec(bmc_ip="10.99.0.1", vendor="dell", hostname="node1", selected_disks=["sda"]),
    ),
    StartFabricApply: StartFabricApply(job_id=_JOB, caller="admin"),
    StartFabricTeardown: StartFabricTeardown(job_id=_JOB, node_ips=["10.0.0.11"], vnis=[100]),
}
