"""Firmware updates (issue 27 item 5) through the real gateway, provisioner and inventory on the
real NATS and PostgreSQL.

On the sushy-tools emulator (its fake driver with the lab's FAKE_HARDWARE prelude, which keeps the
BIOS version its SimpleUpdate sets): what it really emulates — ``UpdateService.SimpleUpdate`` with
``ImageURI`` and a System as ``Targets`` bumps the System's BiosVersion and answers 204 with the
Location of its one static Task (``Completed``); it has no FirmwareInventory (the hardware record
then lists the System's BIOS and the Manager's firmware as components) and no apply times. Here:
the update end to end with progress on SSE and the version read back, a checksum mismatch that
never reaches the BMC, ``on_reset`` refused, the 409 while a provision job uses the BMC, 422s.

What the emulator does not do — a Task that runs, fails or never ends, a FirmwareInventory, a
vendor's multipart push — on recorded BMCs (``tests/fixtures/firmware_bmc.py``: the iDRAC9 R750
and XCC SR670 V2 captures with a scripted task monitor).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.common.contracts.firmware import FirmwareUpdateView
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN, REQUIRE
from tests.fixtures.firmware_bmc import MONITOR, RecordedUpdateBmc
from tests.fixtures.provision import insert_media_job, retire_leftover_jobs, wait_job, write_inventory
from tests.fixtures.sse import open_sse
from tests.fixtures.wait import wait_until
from tests.lab.redfish_lab import FAKE_HARDWARE, RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]  # the sushy-tools emulator
EMULATED, BUSY = "10.97.0.1", "10.97.0.2"
DELL_IP, LENOVO_IP = "10.97.0.11", "10.97.0.12"
IMAGE = b"karios test firmware image\n" * 4096
SHA = hashlib.sha256(IMAGE).hexdigest()
CAPTURES = Path(__file__).parents[2] / "fixtures" / "redfish_inventory"
DELL = CAPTURES / "dell" / "idrac9-6.00.30.00_poweredge-r750"
LENOVO = CAPTURES / "lenovo" / "xcc-tgbt42s-2.83_thinksystem-sr670-v2"
DELL_BIOS = "/redfish/v1/UpdateService/FirmwareInventory/Installed-159-1.8.2__BIOS.Setup.1-1"
XCC_UEFI = "/redfish/v1/UpdateService/FirmwareInventory/UEFI"
RUNNING = {
    "@odata.type": "#Task.v1_4_3.Task",
    "Id": "JID_471269252011",
    "TaskState": "Running",
    "TaskStatus": "OK",
}


@pytest.fixture(scope="module")
def emulator():
    systems = [
        fake_system("fw1", power_state="On", bios_version="2.4.1"),
        fake_system("fw2", power_state="On", bios_version="1.0.0"),
    ]
    try:
        emu = RedfishEmulator(systems, prelude=FAKE_HARDWARE).start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        if REQUIRE:
            pytest.fail(f"sushy-tools emulator unavailable: {exc} — CI requires it", pytrace=False)
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


def _script(*steps: tuple[int, dict]) -> list[tuple[int, dict]]:
    return list(steps)


@pytest.fixture
async def stack(settings, serve, emulator, tmp_path):
    """Gateway + inventory + provisioner; EMULATED/BUSY are sushy-tools systems, DELL_IP/LENOVO_IP
    recorded BMCs (``stack.bmcs[ip]`` is set by a test before it starts an update)."""
    await retire_leftover_jobs(settings.database_url)
    ips = [EMULATED, BUSY, DELL_IP, LENOVO_IP]
    inventory = write_inventory(tmp_path / "inventory.yaml", ips)
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    images = tmp_path / "images"
    (images / "fw").mkdir(parents=True)
    (images / "fw" / "bios.bin").write_bytes(IMAGE)
    creds = {"username": emulator.username, "password": emulator.password}
    endpoints = {
        ip: {"url": emulator.url, "system_id": sid, **creds}
        for ip, sid in zip((EMULATED, BUSY), emulator.system_ids, strict=True)
    }
    endpoints[DELL_IP] = {"url": "http://recorded-idrac.test", "username": "root", "password": "calvin"}
    endpoints[LENOVO_IP] = {"url": "http://recorded-xcc.test", "username": "USERID", "password": "PASSW0RD"}
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        images_dir=images,
        bmc_retries=0,
        bmc_endpoints=endpoints,
    )
    prov = provisioner_app(settings, cfg)
    recorded: dict[str, RecordedUpdateBmc] = {}

    def factory(cls, ep):  # type: ignore[no-untyped-def]
        bmc = recorded.get(ep.bmc_ip)
        return cls(ep, transport=bmc.transport()) if bmc is not None else cls(ep)

    prov.state.firmware.driver_factory = factory
    prov.state.firmware.poll_interval = 0.05
    running = await serve(prov)
    cfg.media_url = running.url  # what a registered image's URL starts with
    prov.state.firmware.image_base_url = running.url
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=60) as client:
        client.prov = prov  # type: ignore[attr-defined]
        client.prov_url = running.url  # type: ignore[attr-defined]
        client.bmcs = recorded  # type: ignore[attr-defined]
        yield client


async def _ended(client: httpx.AsyncClient, ip: str, update_id: str) -> dict:
    got: dict = {}

    async def done() -> bool:
        r = await client.get(f"/controlnode/bmc/{ip}/firmware-updates/{update_id}")
        assert r.status_code == 200, r.text
        got.update(r.json())
        return got["state"] in ("succeeded", "failed", "timed_out")

    await wait_until(done, timeout=60, what=f"firmware update {update_id} to end")
    return got


def _bios(record: dict) -> dict:
    return next(c for c in record["firmware"] if c["kind"] == "bios")


# -- sushy-tools -----------------------------------------------------------------------------------


async def test_an_update_reaches_the_emulator_with_progress_on_sse_and_the_version_read_back(stack) -> None:
    inspected = await stack.post(f"/controlnode/bmc/{EMULATED}/inspect", json={})
    assert inspected.status_code == 200, inspected.text
    bios = _bios(inspected.json())  # no FirmwareInventory: the System's BiosVersion, its URI as target
    assert bios["uri"].startswith("/redfish/v1/Systems/") and bios["id"].endswith("/BIOS"), bios
    image_url = f"{stack.prov_url}/images/fw/bios.bin"  # fetched and hashed by the provisioner

    async with open_sse(stack, f"/controlnode/events?channel=node:{EMULATED}") as sse:
        r = await stack.post(
            f"/controlnode/bmc/{EMULATED}/firmware-update",
            json={"image_url": image_url, "sha256": SHA, "targets": [bios["uri"]]},
        )
        assert r.status_code == 202, r.text
        started = r.json()
        events = await sse.collect(
            until=lambda evs: any(
                e.event == "firmware_progress" and e.json()["data"]["state"] == "succeeded" for e in evs
            )
        )
    assert started["state"] == "queued" and started["sha256"] == SHA and started["requested_by"]
    progress = [e.json()["data"] for e in events if e.event == "firmware_progress"]
    assert all(p["job_id"] == started["id"] for p in progress)
    states = [p["state"] for p in progress]
    assert states[0] == "verifying" and "transferring" in states and "running" in states, states
    major, minor, *rest = bios["version"].split(".")
    bumped = ".".join([major, str(int(minor) + 1), *rest])  # what sushy-tools' SimpleUpdate does
    final = progress[-1]
    assert final["percent"] == 100 and final["components"][0]["version_after"] == bumped

    view = await _ended(stack, EMULATED, started["id"])
    assert view["state"] == "succeeded" and view["method"] == "simple_update"
    assert view["task_uri"] == "/redfish/v1/TaskService/Tasks/42" and view["task_state"] == "Completed"
    assert [
        (c["uri"], c["version_before"], c["version_after"], c["outcome"]) for c in view["components"]
    ] == [(bios["uri"], bios["version"], bumped, "updated")]
    again = await stack.post(f"/controlnode/bmc/{EMULATED}/inspect", json={})
    assert _bios(again.json())["version"] == bumped  # the emulated BMC really runs the new version


async def test_a_checksum_mismatch_fails_before_the_bmc_is_given_the_image(stack) -> None:
    before = _bios((await stack.post(f"/controlnode/bmc/{BUSY}/inspect", json={})).json())
    wrong = hashlib.sha256(b"another image").hexdigest()
    r = await stack.post(
        f"/controlnode/bmc/{BUSY}/firmware-update",
        json={"image": "fw/bios.bin", "sha256": wrong, "targets": [before["uri"]]},
    )
    assert r.status_code == 202, r.text
    view = await _ended(stack, BUSY, r.json()["id"])
    assert view["state"] == "failed" and view["error"].startswith(f"sha256: the image hashes to {SHA}")
    assert view["method"] == "" and view["task_uri"] == ""  # the BMC was never asked
    after = _bios((await stack.post(f"/controlnode/bmc/{BUSY}/inspect", json={})).json())
    assert after["version"] == before["version"]


async def test_on_reset_is_refused_by_a_bmc_that_does_not_advertise_apply_times(stack) -> None:
    r = await stack.post(
        f"/controlnode/bmc/{BUSY}/firmware-update",
        json={"image": "fw/bios.bin", "sha256": SHA, "apply_time": "on_reset"},
    )
    assert r.status_code == 202, r.text
    view = await _ended(stack, BUSY, r.json()["id"])
    assert view["state"] == "failed" and view["error"].startswith("apply_time: the BMC does not advertise")


async def test_refused_while_a_provision_job_uses_the_bmc(stack, settings) -> None:
    await insert_media_job(stack.prov.state.jobs, "fw-busy-job", BUSY, state="installing")
    try:
        r = await stack.post(
            f"/controlnode/bmc/{BUSY}/firmware-update", json={"image": "fw/bios.bin", "sha256": SHA}
        )
        assert r.status_code == 409 and r.json()["code"] == "FIRMWARE_UPDATE_REFUSED", r.text
        assert r.json()["details"] == {"job_id": "fw-busy-job", "reason": "provision_job"}
    finally:
        await retire_leftover_jobs(settings.database_url)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"image": "fw/bios.bin", "sha256": "z" * 64}, "sha256"),
        ({"image": "fw/bios.bin", "image_url": "http://x/y", "sha256": SHA}, "image_url"),
        ({"image_url": "file:///etc/passwd", "sha256": SHA}, "image_url"),
        ({"image_url": "http://user:secret@10.0.0.1/fw.bin", "sha256": SHA}, "image_url"),
        ({"image": "../secrets", "sha256": SHA}, "image"),
        ({"image": "fw/none.bin", "sha256": SHA}, "image"),  # not registered: the provisioner says so
        ({"image": "fw/bios.bin", "sha256": SHA, "targets": ["Systems/1"]}, "targets"),
        ({"image": "fw/bios.bin", "sha256": SHA, "apply_time": "later"}, "apply_time"),
    ],
)
async def test_bad_requests_are_422_naming_the_field(stack, body: dict, field: str) -> None:
    r = await stack.post(f"/controlnode/bmc/{EMULATED}/firmware-update", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json().get("field", "") + str(r.json().get("details", "")), r.text


async def test_an_update_whose_provisioner_died_is_failed_saying_where_to_look(stack) -> None:
    """A row left `running` by a replica that died (no progress for 5 minutes) reads as failed."""
    then = "2026-01-01T12:00:00+00:00"
    orphan = FirmwareUpdateView(
        id="fw-orphan-1", bmc_ip=BUSY, state="running", image_url="http://x/fw.bin", sha256=SHA,
        task_uri="/redfish/v1/TaskService/Tasks/7", created_at=then, updated_at=then,
    )  # fmt: skip
    await stack.prov.state.firmware.store.insert(orphan)
    r = await stack.get(f"/controlnode/bmc/{BUSY}/firmware-updates/fw-orphan-1")
    assert r.status_code == 200 and r.json()["state"] == "failed", r.text
    assert r.json()["error"].endswith("(its task: /redfish/v1/TaskService/Tasks/7)")


async def test_an_unknown_update_is_404(stack) -> None:
    r = await stack.get(f"/controlnode/bmc/{EMULATED}/firmware-updates/no-such-update")
    assert r.status_code == 404 and r.json()["code"] == "FIRMWARE_UPDATE_NOT_FOUND", r.text


# -- the policy: firmware before the install, in the same maintenance window ------------------------


async def test_held_updates_run_in_the_next_provision_job_before_its_medium(stack, settings) -> None:
    """A held update waits (no BMC contact); the BMC's next provision job runs it after its BMC
    check and before it builds its medium; a held update that fails fails the job, nothing built."""
    bios = _bios((await stack.post(f"/controlnode/bmc/{BUSY}/inspect", json={})).json())
    wrong = hashlib.sha256(b"not this image").hexdigest()
    good, bad = [
        await stack.post(
            f"/controlnode/bmc/{BUSY}/firmware-update",
            json={
                "image": "fw/bios.bin",
                "sha256": sha,
                "targets": [bios["uri"]],
                "when": "before_next_install",
            },
        )
        for sha in (SHA, wrong)
    ]
    assert good.status_code == bad.status_code == 202, (good.text, bad.text)
    assert good.json()["state"] == bad.json()["state"] == "held"
    held = await stack.get(f"/controlnode/bmc/{BUSY}/firmware-updates/{good.json()['id']}")
    assert held.json()["state"] == "held" and held.json()["method"] == ""  # nothing sent yet

    try:
        r = await stack.post(
            "/controlnode/provision", json={"bmc_IP": BUSY, "vendor": "generic", "hostname": "fw2"}
        )
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        job = await wait_job(stack, job_id, {"failed"})
        first = await _ended(stack, BUSY, good.json()["id"])
        second = await _ended(stack, BUSY, bad.json()["id"])
    finally:
        await retire_leftover_jobs(settings.database_url)
    assert first["state"] == "succeeded" and first["provision_job_id"] == job_id  # the oldest first
    assert (
        first["components"][0]["version_before"] == bios["version"] != first["components"][0]["version_after"]
    )
    assert second["state"] == "failed" and second["error"].startswith("sha256:")
    assert second["provision_job_id"] == job_id
    assert job["message"].startswith(
        f"firmware update {bad.json()['id']} (held for this install) ended failed"
    )
    assert not (stack.prov.state.config.media_dir / f"{job_id}.iso").exists()  # failed before the medium


# -- recorded BMCs: what the emulator does not do -------------------------------------------------


async def test_a_recorded_idrac_task_is_followed_through_its_progress_to_the_new_version(stack) -> None:
    bmc = RecordedUpdateBmc(
        DELL,
        script=_script(
            (202, {**RUNNING, "PercentComplete": 30}),
            (
                202,
                {
                    **RUNNING,
                    "PercentComplete": 80,
                    "Messages": [
                        {
                            "MessageId": "IDRAC.2.8.RED033",
                            "Message": "The image is being flashed.",
                            "Severity": "OK",
                        }
                    ],
                },
            ),
            (
                200,
                {
                    **RUNNING,
                    "TaskState": "Completed",
                    "PercentComplete": 100,
                    "Messages": [
                        {
                            "MessageId": "IDRAC.2.8.RED001",
                            "Message": "Job completed successfully.",
                            "Severity": "OK",
                        }
                    ],
                },
            ),
        ),
        updated_uri=DELL_BIOS,
        new_version="1.9.0",
        username="root",
        password="calvin",
    )
    stack.bmcs[DELL_IP] = bmc
    async with open_sse(stack, f"/controlnode/events?channel=node:{DELL_IP}") as sse:
        r = await stack.post(
            f"/controlnode/bmc/{DELL_IP}/firmware-update",
            json={"image": "fw/bios.bin", "sha256": SHA, "targets": [DELL_BIOS]},
        )
        assert r.status_code == 202, r.text
        events = await sse.collect(
            until=lambda evs: any(
                e.event == "firmware_progress" and e.json()["data"]["state"] == "succeeded" for e in evs
            )
        )
    sent = bmc.updates[0]["json"]
    assert sent == {
        "ImageURI": f"{stack.prov_url}/images/fw/bios.bin",
        "TransferProtocol": "HTTP",
        "Targets": [DELL_BIOS],
        "@Redfish.OperationApplyTime": "Immediate",
    }
    percents = [e.json()["data"]["percent"] for e in events if e.event == "firmware_progress"]
    assert {30, 80, 100} <= set(percents) and percents == sorted(percents), percents
    view = await _ended(stack, DELL_IP, r.json()["id"])
    assert view["state"] == "succeeded" and view["task_uri"] == MONITOR and view["task_state"] == "Completed"
    assert (
        "The image is being flashed." in view["messages"]
        and "Job completed successfully." in view["messages"]
    )
    assert [
        (c["kind"], c["version_before"], c["version_after"], c["outcome"]) for c in view["components"]
    ] == [("bios", "1.8.2", "1.9.0", "updated")]


async def test_a_task_that_ends_in_exception_fails_the_update_with_its_message(stack) -> None:
    bmc = RecordedUpdateBmc(
        DELL,
        script=_script(
            (202, {**RUNNING, "PercentComplete": 10}),
            (
                200,
                {
                    **RUNNING,
                    "TaskState": "Exception",
                    "TaskStatus": "Critical",
                    "Messages": [
                        {
                            "MessageId": "IDRAC.2.8.RED007",
                            "Message": "Unable to verify Update Package signature.",
                            "Severity": "Critical",
                        }
                    ],
                },
            ),
        ),
        updated_uri=DELL_BIOS,
        new_version="1.8.2",
        username="root",
        password="calvin",
    )
    stack.bmcs[DELL_IP] = bmc
    r = await stack.post(
        f"/controlnode/bmc/{DELL_IP}/firmware-update",
        json={"image": "fw/bios.bin", "sha256": SHA, "targets": [DELL_BIOS]},
    )
    view = await _ended(stack, DELL_IP, r.json()["id"])
    assert view["state"] == "failed" and view["error"] == "the BMC's task ended in Exception"
    assert "Critical: Unable to verify Update Package signature." in view["messages"]
    assert [(c["version_after"], c["outcome"]) for c in view["components"]] == [("1.8.2", "unchanged")]


@pytest.mark.slow
async def test_a_task_that_never_ends_times_out_and_a_second_update_is_refused_meanwhile(
    stack, settings
) -> None:
    stack.bmcs[DELL_IP] = RecordedUpdateBmc(
        DELL,
        script=_script((202, {**RUNNING, "PercentComplete": 5})),
        updated_uri=DELL_BIOS,
        new_version="1.8.2",
        username="root",
        password="calvin",
    )
    body = {"image": "fw/bios.bin", "sha256": SHA, "targets": [DELL_BIOS], "timeout_s": 10}
    r = await stack.post(f"/controlnode/bmc/{DELL_IP}/firmware-update", json=body)
    assert r.status_code == 202, r.text
    second = await stack.post(f"/controlnode/bmc/{DELL_IP}/firmware-update", json=body)
    assert second.status_code == 409 and second.json()["details"]["reason"] == "firmware_update", second.text
    assert second.json()["details"]["update_id"] == r.json()["id"]
    # a provision meanwhile would reset the BMC mid-flash: its job fails naming the update
    try:
        p = await stack.post(
            "/controlnode/provision", json={"bmc_IP": DELL_IP, "vendor": "dell", "hostname": "fw-flash"}
        )
        assert p.status_code == 202, p.text
        job = await wait_job(stack, p.json()["job_id"], {"failed"})
        assert job["message"].startswith(f"bmc_ip: firmware update {r.json()['id']} is running on BMC"), job
    finally:
        await retire_leftover_jobs(settings.database_url)
    view = await _ended(stack, DELL_IP, r.json()["id"])
    assert view["state"] == "timed_out" and view["error"] == "the BMC's task did not end within 10s"
    assert view["percent"] == 5


async def test_lenovo_xcc_gets_the_image_by_multipart_push(stack) -> None:
    reg = await stack.post(
        "/controlnode/register",
        json={"bmc_ip": LENOVO_IP, "bmc_username": "USERID", "bmc_password": "PASSW0RD", "vendor": "lenovo"},
    )
    assert reg.status_code in (200, 201), reg.text
    bmc = RecordedUpdateBmc(
        LENOVO,
        script=_script(
            (202, {**RUNNING, "PercentComplete": 50}), (200, {**RUNNING, "TaskState": "Completed"})
        ),
        updated_uri=XCC_UEFI,
        new_version="TEE180J-3.20",
        username="USERID",
        password="PASSW0RD",
    )
    stack.bmcs[LENOVO_IP] = bmc
    r = await stack.post(
        f"/controlnode/bmc/{LENOVO_IP}/firmware-update",
        json={"image": "fw/bios.bin", "sha256": SHA, "targets": [XCC_UEFI]},
    )
    assert r.status_code == 202, r.text
    view = await _ended(stack, LENOVO_IP, r.json()["id"])
    assert view["state"] == "succeeded" and view["method"] == "multipart_push", view
    push = bmc.updates[0]
    assert push["parts"] == ["UpdateParameters", "UpdateFile"] and push["image_bytes"] == len(IMAGE)
    assert push["UpdateParameters"] == {"Targets": [XCC_UEFI]}
    (uefi,) = view["components"]
    assert (uefi["id"], uefi["kind"], uefi["version_after"], uefi["outcome"]) == (
        "UEFI",
        "bios",
        "TEE180J-3.20",
        "updated",
    )
