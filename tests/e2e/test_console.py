"""The web console in a real headless Chromium (Debian's ``chromium`` + ``chromedriver``, driven by
Selenium) against ``karios up`` with emulated BMCs (sushy-tools) and, as root, the fabric lab's
three namespace nodes (real sshd + FRR) behind a route reflector.

Logs in with a token; starts a provision from the console and watches its page reach
``booting``; cancels another from its page; a viewer's pages carry no write control (and the API
refuses the viewer anyway); the fabric page runs a preflight (node3's 1500 MTU shown on the node),
then an apply, and shows the three nodes turn Established. Day-2 (issue 26 item 5): the job page
names host, OS, method and who started it and retries an ended job; screen readers are told of
progress (aria-live); the servers view (inventory, last job, hardware record) is searched and
filtered, the job history paged; the fabric config is created from a form whose 422 shows beside
the field; a discovered server is adopted; at 375 px no page scrolls sideways. Every page is
saved as a screenshot under ``$KARIOS_SCREENSHOTS`` (default ``/tmp/karios-console-screenshots``);
the paths are printed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.console.views import hardware_summary
from karios.common.contracts.hardware import HardwareRecord
from karios.common.discovery_token import DiscoveryTokens
from karios.common.settings import KariosSettings
from tests.fixtures.chaos import KariosUp, state_dir
from tests.fixtures.provision import medium_token, write_inventory
from tests.fixtures.wait import wait_until_sync
from tests.lab.redfish_lab import RedfishEmulator, fake_system

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
import fabric_lab

# The module's setup waits for the fabric lab (one per host, serialised by a lock) and `karios up`.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(900), pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = Path(os.environ.get("KARIOS_SCREENSHOTS", "/tmp/karios-console-screenshots"))
BMCS = ["10.97.0.1", "10.97.0.2"]
FABRIC_CONFIG = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_name": "rr",
    "fabric_switch_nos": "other",
    "fabric_switch_peering_ip": fabric_lab.FABRIC_IP,
    "fabric_switch_role": "spine",
    "management_cidr": "198.18.0.0/24",
    "router_id_cidr": "198.19.1.1/24",
    "vxlan_mtu": 1500,  # node3's underlay carries 1500: a drift to show, not a blocker
    "ospf_enabled": False,
    "expected_nodes": 3,
}


def _chromium_missing() -> str | None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    return (
        f"{' and '.join(missing)} not installed (apt-get install chromium chromium-driver)"
        if missing
        else None
    )


@pytest.fixture(scope="module")
def system() -> Iterator[KariosUp]:
    """`karios up` with emulated BMCs. Its fabric worker reads the SSH key from ``fabric_key``
    when it connects: the :func:`lab` fixture puts the lab's key there, so only the fabric test
    waits for the host's fabric lab (one at a time per host)."""
    emu = RedfishEmulator([fake_system(f"console{i}") for i in range(len(BMCS))]).start()
    try:
        with state_dir("karios-console-") as root:
            inv = write_inventory(root / "inventory.yaml", BMCS)
            endpoints = {
                ip: {"url": emu.url, "system_id": sid, "username": emu.username, "password": emu.password}
                for ip, sid in zip(BMCS, emu.system_ids, strict=True)
            }
            env = {
                "KARIOS_INVENTORY_FILE": str(inv),
                "KARIOS_PROVISIONER_BMC_ENDPOINTS": json.dumps(endpoints),
                "KARIOS_PROVISIONER_INSTALL_METHOD": "preseed",
                "KARIOS_FABRIC_SSH_KEY": str(root / "fabric_key"),
                "KARIOS_FABRIC_VNIS": "100,200",
                "KARIOS_FABRIC_FRR_LOG_FILE": "/run/frr/frr.log",
                "KARIOS_FABRIC_CONNECT_TIMEOUT": "5",
                "KARIOS_FABRIC_VERIFY_TIMEOUT": "60",
                "KARIOS_FABRIC_PREFLIGHT_TIMEOUT": "15",
            }
            up = KariosUp(root / "state", env=env)
            try:
                up.wait_started()
                yield up
            finally:
                up.stop()
    finally:
        emu.stop()


@pytest.fixture(scope="module")
def lab(system: KariosUp) -> Iterator[fabric_lab.FabricLab]:
    reason = fabric_lab.skip_reason()
    if reason:
        if CI:
            pytest.fail(f"fabric lab required in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    with fabric_lab.FabricLab(n_nodes=3, prefix="kc", mtu_overrides={"node3": 1500}) as lab:
        key = system.state.parent / "fabric_key"
        shutil.copyfile(lab.client_key_path, key)
        key.chmod(0o600)
        yield lab


@pytest.fixture(scope="module")
def browser():
    reason = _chromium_missing()
    if reason:
        if CI or os.geteuid() == 0:
            pytest.fail(f"the console test needs a browser: {reason}", pytrace=False)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="karios-chromium-")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver, name: str) -> Path:
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def click(driver, selector: str, timeout: float = 10) -> None:
    """Click the first match of ``selector``. A live region may swap it between the find and the
    click (an event changed what the region shows): find it again, as a user's next click would."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while True:
        try:
            css(driver, selector)[0].click()
            return
        except StaleElementReferenceException:
            if time.monotonic() > deadline:
                raise


def attrs(driver, selector: str, attr: str) -> list[str]:
    """``attr`` of every match, read in one script (live regions are swapped under the test)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.getAttribute(arguments[1]))",
        selector,
        attr,
    )


def texts(driver, selector: str) -> list[str]:
    """The text of every match, read in one script."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent.trim())", selector
    )


def login(driver, up: KariosUp, token: str) -> None:
    driver.get(up.url() + "/console/login")
    css(driver, "#token")[0].send_keys(token)
    click(driver, "#login")
    wait_until_sync(lambda: driver.current_url.endswith("/console/jobs"), timeout=30, what="the jobs page")


def logged_out(driver) -> bool:
    return "/console/login" in driver.current_url


def installer_step(up: KariosUp, job_id: str, **report) -> None:
    """An installer report for ``job_id``, with the token its medium carries (as the installer)."""
    token, _ = medium_token(up.state / "provisioner" / "media" / f"{job_id}.slot")
    r = httpx.post(
        f"{up.url()}/controlnode/job/{job_id}/step",
        json=report,
        headers={"X-Karios-Job-Token": token},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def logout(driver) -> None:
    click(driver, "#logout")
    wait_until_sync(lambda: driver.current_url.endswith("/console/login"), timeout=30, what="the login page")


def provision_from_console(driver, bmc: str, hostname: str) -> str:
    """Fill the provision form; the console opens the new job's page: its id."""
    from selenium.webdriver.support.ui import Select

    driver.get(driver.current_url.split("/console")[0] + "/console/jobs")
    css(driver, "#prov-bmc")[0].send_keys(bmc)
    Select(css(driver, "#prov-vendor")[0]).select_by_visible_text("generic")
    css(driver, "#prov-hostname")[0].send_keys(hostname)
    click(driver, "#provision")
    wait_until_sync(lambda: "/console/jobs/" in driver.current_url, timeout=30, what=f"the job page of {bmc}")
    return driver.current_url.rsplit("/", 1)[1]


def job_state(driver) -> str:
    return (attrs(driver, "#job-state", "data-state") or [""])[0]


def test_login_provision_to_booting_and_cancel(system: KariosUp, browser) -> None:
    d = browser
    d.get(system.url() + "/console/jobs")
    assert logged_out(d)  # no cookie: the login page
    css(d, "#token")[0].send_keys("kt_not-a-token")
    click(d, "#login")
    wait_until_sync(lambda: css(d, "#login-error"), timeout=20, what="the login error")
    assert "rejected" in css(d, "#login-error")[0].text
    shot(d, "01-login")
    login(d, system, system.token)
    assert "bootstrap-admin" in css(d, "#who")[0].text
    # The token sits in an HttpOnly cookie: the page's script cannot read it.
    assert d.execute_script("return document.cookie") == ""

    job_id = provision_from_console(d, BMCS[0], "console-a")
    wait_until_sync(
        lambda: job_state(d) == "booting",
        timeout=150,
        interval=0.5,
        what="the job page to show booting",
    )
    stages = attrs(d, "#timeline li[data-stage]", "data-stage")
    assert "Booting" in stages and "Building ISO" in stages, stages
    assert d.execute_script("return document.body.dataset.sse") == "open"
    shot(d, "02-job-booting")

    # The installer reports a stage with its log (as the real one does, with the medium's token):
    # the open page shows the new stage and the log tail without a reload.
    token, _ = medium_token(
        system.state / "provisioner" / "media" / f"{job_id}.slot"
    )  # /media needs the signed URL
    r = httpx.post(
        f"{system.url()}/controlnode/job/{job_id}/step",
        json={"step": "partitioning", "state": "active", "log": ["mkfs.ext4 /dev/sda2", "console-log-line"]},
        headers={"X-Karios-Job-Token": token},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    wait_until_sync(lambda: "console-log-line" in (texts(d, "#log-tail") or [""])[0], timeout=30,
                    what="the log tail on the open job page")  # fmt: skip
    assert job_state(d) == "installing"
    shot(d, "02b-job-installer-log")

    other = provision_from_console(d, BMCS[1], "console-b")
    assert other != job_id
    wait_until_sync(lambda: css(d, "#cancel-job"), timeout=30, what="the cancel button")
    # A keyboard user on Cancel keeps the focus through the live region's refreshes (the 5 s
    # backstop re-fetches it; a refresh that changes nothing leaves the DOM, one that does
    # focuses the same control again).
    d.execute_script("document.querySelector('#cancel-job').focus()")
    time.sleep(6)
    assert d.execute_script("return document.activeElement && document.activeElement.id") == "cancel-job"
    click(d, "#cancel-job")
    wait_until_sync(
        lambda: job_state(d) == "cancelled", timeout=90, interval=0.5, what="the job to be cancelled"
    )
    assert "cancel requested" in texts(d, "#flash")[0]
    assert not css(d, "#cancel-job")  # an ended job has nothing to cancel
    shot(d, "03-job-cancelled")

    d.get(system.url() + "/console/jobs")
    assert {job_id, other} <= set(attrs(d, "#jobs-table tr[data-job-id]", "data-job-id"))
    assert attrs(d, f'tr[data-job-id="{other}"] td.state', "data-state") == ["cancelled"]
    shot(d, "04-jobs")
    d.get(system.url() + "/console/nodes")
    assert {BMCS[0], BMCS[1]} <= set(attrs(d, "#bmcs-table tr[data-bmc]", "data-bmc"))
    shot(d, "05-nodes")


def job_state_of(up: KariosUp, job_id: str) -> str:
    r = httpx.get(
        f"{up.url()}/controlnode/job/{job_id}", headers={"Authorization": f"Bearer {up.token}"}, timeout=30
    )
    return r.json()["job_status"]


def test_job_page_facts_retry_and_progress_told_to_screen_readers(system: KariosUp, browser) -> None:
    """The cancelled job's page names its request and who started it; Retry sends it again (a new
    job); that job fails on the open page, which says so to a screen reader and offers Retry."""
    d = browser
    d.get(system.url() + "/console/jobs?status=cancelled")
    cancelled = attrs(d, f'#jobs-table tr[data-bmc="{BMCS[1]}"]', "data-job-id")[0]
    d.get(system.url() + f"/console/jobs/{cancelled}")

    # The audit trail is written in the background (the record is there a moment after the 202),
    # and a provisioner busy building media may answer after the page's 5 s (a note says so).
    def facts() -> dict[str, str]:
        d.refresh()
        return {
            k: (texts(d, f"#job-{k}") or [""])[0]
            for k in ("hostname", "os", "method", "vendor", "started-by")
        }

    def known() -> bool:
        got = facts()
        return bool(got["os"]) and got["started-by"].startswith("bootstrap-admin (")

    wait_until_sync(known, timeout=60, what="the job's request and who started it")
    got = facts()
    assert (got["hostname"], got["os"], got["method"], got["vendor"]) == (
        "console-b",
        "Debian 12",
        "preseed",
        "generic",
    )
    assert attrs(d, "#announce", "aria-live") == ["polite"] and attrs(d, "#flash", "aria-live") == ["polite"]
    shot(d, "15-job-facts-retry")

    click(d, "#retry-job")
    wait_until_sync(lambda: not d.current_url.endswith(cancelled), timeout=30, what="the retried job's page")
    retried = d.current_url.rsplit("/", 1)[1]
    wait_until_sync(lambda: texts(d, "#job-hostname") == ["console-b"], timeout=30, what="the new job's page")
    wait_until_sync(lambda: job_state(d) == "booting", timeout=150, interval=0.5, what="the retry to boot")

    installer_step(system, retried, step="partitioning", state="failed", message="no disk console-fail")
    wait_until_sync(
        lambda: job_state(d) == "failed", timeout=30, interval=0.5, what="the job page to show failed"
    )
    wait_until_sync(lambda: "Job failed" in texts(d, "#announce")[0], timeout=30, what="the aria-live line")
    assert "console-fail" in texts(d, "#job-message")[0]
    wait_until_sync(lambda: css(d, "#retry-job"), timeout=30, what="Retry on the failed job")
    shot(d, "16-job-failed-announced")


def test_servers_view_search_filter_and_paged_history(system: KariosUp, browser) -> None:
    admin = {"Authorization": f"Bearer {system.token}"}
    r = httpx.post(f"{system.url()}/controlnode/bmc/{BMCS[0]}/inspect", json={}, headers=admin, timeout=90)
    assert r.status_code == 200, r.text
    summary = hardware_summary(HardwareRecord.model_validate(r.json()))
    d = browser
    d.get(system.url() + "/console/servers")
    rows = dict(zip(attrs(d, "#servers-table tr[data-bmc]", "data-bmc"),
                    attrs(d, "#servers-table tr[data-bmc]", "data-state"), strict=True))  # fmt: skip
    assert rows[BMCS[0]] == "running" and rows[BMCS[1]] == "failed", rows
    assert texts(d, f'#servers-table tr[data-bmc="{BMCS[0]}"] td.hardware .hw-summary') == [summary]
    assert texts(d, f'#servers-table tr[data-bmc="{BMCS[1]}"] td.hardware .hw-summary') == ["not inspected"]
    # the inspected row also says how it compares with the inventory (the diff, or "matches")
    assert css(d, f'#servers-table tr[data-bmc="{BMCS[0]}"] td.hardware :is(.hw-diff, .hw-in-sync)')
    assert not css(d, f'#servers-table tr[data-bmc="{BMCS[1]}"] td.hardware :is(.hw-diff, .hw-in-sync)')
    shot(d, "17-servers")

    css(d, "#srv-q")[0].send_keys(BMCS[1])
    click(d, "#srv-filter")
    wait_until_sync(lambda: "q=" in d.current_url, timeout=30, what="the search")
    assert attrs(d, "#servers-table tr[data-bmc]", "data-bmc") == [BMCS[1]]
    from selenium.webdriver.support.ui import Select

    d.get(system.url() + "/console/servers")
    Select(css(d, "#srv-state")[0]).select_by_value("running")
    click(d, "#srv-filter")
    wait_until_sync(lambda: "state=running" in d.current_url, timeout=30, what="the filter")
    assert attrs(d, "#servers-table tr[data-bmc]", "data-bmc") == [BMCS[0]]

    # History: every job, two a page, newest first; then only the cancelled ones.
    every: set[str] = set()
    d.get(system.url() + "/console/jobs?size=2")
    for n in range(2, 100):
        ids = attrs(d, "#jobs-table tr[data-job-id]", "data-job-id")
        assert ids and len(ids) <= 2 and not every & set(ids), (every, ids)  # no job on two pages
        every |= set(ids)
        nxt = css(d, "#page-next")
        if not nxt:
            break
        nxt[0].click()
        wait_until_sync(lambda n=n: texts(d, "#page-no") == [f"page {n}"], timeout=30, what=f"page {n}")
    d.get(system.url() + "/console/jobs?size=500")
    assert every == set(attrs(d, "#jobs-table tr[data-job-id]", "data-job-id")) and len(every) >= 3
    shot(d, "18-jobs-last-page")
    d.get(system.url() + "/console/jobs")
    Select(css(d, "#jobs-status")[0]).select_by_visible_text("cancelled")
    click(d, "#jobs-filter-go")
    wait_until_sync(lambda: "status=cancelled" in d.current_url, timeout=30, what="the status filter")
    assert set(attrs(d, "#jobs-table td.state", "data-state")) == {"cancelled"}


def test_discovered_server_adopted_from_the_console(system: KariosUp, browser) -> None:
    """A machine reports through the discovery image (the token the boot would carry); the
    console lists it; a bad name is refused beside the field; then it is adopted."""
    key = (system.state / "secret.key").read_text().strip()
    tokens = DiscoveryTokens.from_settings(KariosSettings(secret_key=key, dev_mode=True))
    mac = "52:54:00:c0:50:1e"
    report = {
        "boot_mac": mac,
        "dmi": {"sys_vendor": "QEMU", "product_name": "Standard PC", "product_serial": "CONSOLE-DISC-1"},
        "cpu_model": "Console CPU",
        "memory_mib": 4096,
        "nics": [{"name": "eth0", "mac": mac, "link": "up"}],
    }
    r = httpx.post(
        system.url() + "/controlnode/discovery/report",
        json=report,
        headers={"X-Karios-Discovery-Token": tokens.issue(mac, now=time.time())},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    found = r.json()["id"]
    d = browser
    d.get(system.url() + "/console/discovered")
    row = f'#discovered-table tr[data-id="{found}"]'
    assert "QEMU Standard PC" in texts(d, row)[0] and "CONSOLE-DISC-1" in texts(d, row)[0]
    css(d, f"{row} .adopt-hostname")[0].send_keys("Not_A_Host!")
    click(d, f"{row} button.adopt")
    wait_until_sync(lambda: texts(d, f'{row} [data-error-for="hostname"]')[0], timeout=30, what="the 422")
    css(d, f"{row} .adopt-hostname")[0].clear()
    css(d, f"{row} .adopt-hostname")[0].send_keys("console-disc-1")
    click(d, f"{row} button.adopt")
    wait_until_sync(lambda: "adopted as console-disc-1" in texts(d, "#flash")[0], timeout=30, what="adopted")
    wait_until_sync(lambda: attrs(d, row, "data-status") == ["adopted"], timeout=30, what="the page reloaded")
    shot(d, "19-discovered-adopted")


def test_narrow_layout_has_no_horizontal_scroll(system: KariosUp, browser) -> None:
    d = browser
    d.get(system.url() + "/console/jobs")
    job_id = attrs(d, "#jobs-table tr[data-job-id]", "data-job-id")[0]
    # A phone's viewport (headless Chromium's window is never narrower than 500 px).
    d.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 375, "height": 800, "deviceScaleFactor": 1, "mobile": True},
    )
    try:
        assert d.execute_script("return window.innerWidth") == 375
        for name, path in [
            ("20-narrow-jobs", "/console/jobs"),
            ("21-narrow-job", f"/console/jobs/{job_id}"),
            ("22-narrow-servers", "/console/servers"),
            ("23-narrow-nodes", "/console/nodes"),
            ("24-narrow-fabric", "/console/fabric"),
            ("25-narrow-discovered", "/console/discovered"),
        ]:
            d.get(system.url() + path)
            wide = d.execute_script(
                "const e = document.documentElement; return [e.scrollWidth, e.clientWidth,"
                " Array.from(document.querySelectorAll('body *')).filter(x => x.getBoundingClientRect().right"
                " > e.clientWidth + 1).map(x => x.tagName + '#' + x.id + '.' + x.className).slice(0, 5)]"
            )
            assert wide[0] <= wide[1], (path, wide)
            shot(d, name)
    finally:
        d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_fabric_config_created_from_the_form_422_beside_the_field(system: KariosUp, browser) -> None:
    """No config yet: the fabric page offers the form; the API's 422 is shown next to the field
    it names; corrected, the config is created (the fabric test then applies this same config)."""
    d = browser
    d.get(system.url() + "/console/fabric")
    assert css(d, "#fabric-create-form"), "no config yet: the create form"
    from selenium.webdriver.support.ui import Select

    for name, value in FABRIC_CONFIG.items():
        field = css(d, f"#new-{name}")[0]
        if field.tag_name == "select":
            Select(field).select_by_visible_text(str(value).lower())
        else:
            field.clear()
            field.send_keys(str(value) if name != "management_cidr" else "198.18.0.0/not-a-mask")
    click(d, "#create-config")
    wait_until_sync(lambda: texts(d, "#err-management_cidr")[0], timeout=30, what="the 422 beside the field")
    assert "not an IPv4 CIDR" in texts(d, "#err-management_cidr")[0]
    assert attrs(d, "#new-management_cidr", "aria-invalid") == ["true"]
    assert not [t for t in texts(d, "[data-error-for]") if t][1:]  # only that field is marked
    shot(d, "26-fabric-create-422")
    field = css(d, "#new-management_cidr")[0]
    field.clear()
    field.send_keys(FABRIC_CONFIG["management_cidr"])
    click(d, "#create-config")
    wait_until_sync(lambda: texts(d, "#cfg-mgmt") == [FABRIC_CONFIG["management_cidr"]], timeout=30,
                    what="the created config on the page")  # fmt: skip
    # The live section can show the new config before the page's reload (800 ms after the
    # 201) replaces the create form with the edit form: wait for the reload (CI 2026-12-05).
    wait_until_sync(lambda: not css(d, "#fabric-create-form") and css(d, "#config-form"), timeout=30,
                    what="the page reloaded with the edit form")  # fmt: skip
    admin = {"Authorization": f"Bearer {system.token}"}
    stored = httpx.get(system.url() + "/controlnode/fabric-config", headers=admin, timeout=30).json()
    assert {k: stored[k] for k in FABRIC_CONFIG} == FABRIC_CONFIG


def test_viewer_sees_no_write_controls(system: KariosUp, browser) -> None:
    r = httpx.post(
        system.url() + "/controlnode/tokens",
        json={"name": "console-viewer", "role": "viewer"},
        headers={"Authorization": f"Bearer {system.token}"},
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    d = browser
    d.get(system.url() + "/console/jobs")
    if not logged_out(d):
        logout(d)
    login(d, system, r.json()["token"])
    assert "viewer" in css(d, "#who")[0].text
    running = attrs(d, f'#jobs-table tr[data-bmc="{BMCS[0]}"]', "data-job-id")[0]
    failed = attrs(d, f'#jobs-table tr[data-bmc="{BMCS[1]}"]', "data-job-id")[0]  # the day-2 test's
    for name, path in [
        ("06-viewer-jobs", "/console/jobs"),
        ("07-viewer-job", f"/console/jobs/{running}"),
        ("07b-viewer-failed-job", f"/console/jobs/{failed}"),
        ("08-viewer-fabric", "/console/fabric"),
        ("09-viewer-nodes", "/console/nodes"),
        ("09b-viewer-servers", "/console/servers"),
        ("09c-viewer-discovered", "/console/discovered"),
    ]:
        d.get(system.url() + path)
        assert css(d, "main h1"), path
        assert not css(d, "[data-write]"), path
        # Log out, and the search forms' buttons (GET: they read): no other button.
        buttons = attrs(d, "button", "id")
        assert set(buttons) <= {"logout", "jobs-filter-go", "srv-filter"} and "logout" in buttons, (
            path,
            buttons,
        )
        assert not css(d, "form:not([method=get]) button:not(#logout)"), path
        shot(d, name)
    assert job_state_of(system, failed) == "failed" and not css(d, "#retry-job")
    # Hiding is not the protection: the API refuses the viewer's write (cookie + console header).
    status = d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/controlnode/job/' + arguments[0] + '/cancel', {method: 'POST',"
        " headers: {'X-Karios-Console': '1'}}).then(r => done(r.status));",
        running,
    )
    assert status == 403
    # Nor can a viewer retry by forging the console's provision request.
    status = d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/controlnode/provision', {method: 'POST', headers: {'X-Karios-Console': '1',"
        " 'Content-Type': 'application/json'}, body: JSON.stringify({bmc_IP: arguments[0],"
        " vendor: 'generic'})}).then(r => done(r.status));",
        BMCS[1],
    )
    assert status == 403
    logout(d)


def _sse_clients(up: KariosUp) -> float:
    """The gateway's ``karios_sse_clients`` gauge: the event streams it serves now."""
    text = httpx.get(up.url() + "/metrics", timeout=10).text
    return next(
        float(line.split()[1]) for line in text.splitlines() if line.startswith("karios_sse_clients ")
    )


def test_a_page_left_holds_no_event_stream_and_one_shown_again_listens(system: KariosUp, browser) -> None:
    """Chromium keeps a page left for another in its back/forward cache; its event stream stayed
    open with it, so after six live pages every one of HTTP/1.1's six connections to the gateway
    was held and the next page waited a minute (three of this module's tests took 60 s each).
    Leaving a page closes its stream; shown again from that cache, it listens again."""
    d = browser
    d.get(system.url() + "/console/jobs")
    if logged_out(d):
        login(d, system, system.token)
    for path in ["/console/fabric", "/console/jobs"] * 4:  # eight live pages, one after another
        d.get(system.url() + path)
        assert d.execute_script("return document.body.dataset.sse") == "open", path
    # One stream: the shown page's (the gauge counts what the gateway still serves).
    wait_until_sync(lambda: _sse_clients(system) == 1, timeout=15, what="one event stream open")
    # Left and shown again: the same document (a marker set before leaving survives only a
    # restore from the cache). Chromium does not keep a page there under every condition (a
    # request still in flight when it is left is one of its reasons), so this is tried up to three
    # times.
    for _ in range(3):
        d.execute_script("window.karios_marker = 'left'")
        d.get(system.url() + "/console/fabric")
        wait_until_sync(lambda: _sse_clients(system) == 1, timeout=15, what="the left page's stream closed")
        d.back()
        if d.execute_script("return window.karios_marker") == "left":
            break
    else:
        pytest.fail("Chromium never showed the jobs page again from its back/forward cache")
    # Listening again: its stream is the only one once the fabric page's has closed.
    wait_until_sync(
        lambda: d.execute_script("return document.body.dataset.sse") == "open" and _sse_clients(system) == 1,
        timeout=15,
        what="the restored page's stream",
    )


def test_fabric_page_nodes_turn_established_after_apply(system: KariosUp, browser, lab) -> None:
    admin = {"Authorization": f"Bearer {system.token}"}
    with httpx.Client(base_url=system.url(), headers=admin, timeout=60) as c:
        for i, n in enumerate(lab.nodes, 1):
            body = {"bmc_ip": f"198.18.1.{i}", "os_ip": n.underlay_ip, "os_username": "root", "fqdn": n.name}
            assert c.post("/controlnode/register", json=body).status_code == 200
        r = c.post("/controlnode/fabric-config", json=FABRIC_CONFIG)
        assert r.status_code in (200, 201), r.text
    d = browser
    login(d, system, system.token)
    d.get(system.url() + "/console/fabric")
    ips = [n.underlay_ip for n in lab.nodes]
    wait_until_sync(
        lambda: len(attrs(d, "g.node", "data-node-ip")) == 3, timeout=30, what="three nodes drawn"
    )
    assert "established" not in attrs(d, "g.node", "data-state")
    assert "route reflector" in texts(d, "#topology")[0]
    shot(d, "10-fabric-before")

    click(d, "#preflight")
    wait_until_sync(
        lambda: css(d, "#preflight-verdict"), timeout=120, interval=0.5, what="the preflight result"
    )
    node3 = texts(d, f'g.node[data-node-ip="{ips[2]}"] text.mtu-drift')
    assert node3 and "1500" in node3[0], "node3's MTU drift is shown on the node"
    assert not texts(d, f'g.node[data-node-ip="{ips[0]}"] text.mtu-drift')
    shot(d, "11-fabric-preflight")

    click(d, "#load-diff")  # what an apply would change, per node (nothing changes yet)
    wait_until_sync(lambda: len(attrs(d, "#diff-out section.node-diff", "data-node-ip")) == 3, timeout=120,
                    interval=0.5, what="the per-node diff")  # fmt: skip
    assert attrs(d, "#diff-out section.node-diff", "data-changed") == ["true"] * 3
    assert len(attrs(d, '#diff-out pre.diff[data-file="frr.conf"]', "data-file")) == 3
    assert any(t.startswith("+router bgp 65000") for t in texts(d, "#diff-out pre.diff .d-add"))
    d.execute_script("document.getElementById('diff').scrollIntoView()")
    shot(d, "12-fabric-diff")
    d.execute_script("window.scrollTo(0, 0)")

    click(d, "#apply")
    wait_until_sync(lambda: "apply" in texts(d, "#flash")[0], timeout=30, what="the apply to start")
    assert "started" in texts(d, "#flash")[0], texts(d, "#flash")

    def established() -> bool:
        return attrs(d, "g.node", "data-state") == ["established"] * 3

    wait_until_sync(established, timeout=240, interval=0.5, what="three nodes Established")
    assert texts(d, "g.node text.state-label") == ["Established"] * 3
    for ip in ips:
        assert "VTEP 198.19.1." in texts(d, f'g.node[data-node-ip="{ip}"]')[0]
    # The job ends after its closing check (the nodes checked before the others were counted look
    # again for every VTEP's IMET routes): a moment after the last node turned Established.
    wait_until_sync(
        lambda: attrs(d, "#fabric-job", "data-job-status") == ["completed"],
        timeout=60,
        interval=0.5,
        what="the apply job completed",
    )
    shot(d, "13-fabric-established")


def test_switch_reconfig_ack_flow(system: KariosUp, browser) -> None:
    """Moving the switch's BGP listen range from the console: the 409's snippet is shown with its
    hash, a confirmation without a name is refused (422 naming acked_by), then saved."""
    admin = {"Authorization": f"Bearer {system.token}"}
    # The route reflector on the switch with a BGP underlay: the switch listens on the management
    # subnet (from no listen range before: not gated). After the fabric test this changes one field.
    r = httpx.post(
        system.url() + "/controlnode/fabric-config",
        # Putting the RR on the switch changes the switch itself (it starts running BGP): set up
        # here without the gate (the bootstrap admin may skip it); the console then meets it.
        json={
            **FABRIC_CONFIG,
            "external_route_reflector": True,
            "fabric_switch_nos": "sonic",
            "skip_switch_ack": True,
            "acked_by": "console-e2e-setup",
        },
        headers=admin,
        timeout=60,
    )
    assert r.status_code in (200, 201), r.text
    d = browser
    d.get(system.url() + "/console/jobs")
    if logged_out(d):
        login(d, system, system.token)
    d.get(system.url() + "/console/fabric")
    field = css(d, "#cfg-management")[0]
    field.clear()
    field.send_keys("198.18.0.0/23")
    click(d, "#save-config")
    wait_until_sync(lambda: css(d, "#ack")[0].is_displayed(), timeout=30, what="the ack box")
    told = css(d, "#ack-ranges")[0].text  # the fields that changed the switch, and the range move
    assert "management_cidr" in told and "from 198.18.0.0/24 to 198.18.0.0/23" in told, told
    assert "bgp listen range 198.18.0.0/23" in css(d, "#ack-snippet")[0].text
    digest = css(d, "#ack-hash")[0].text
    assert len(digest) == 64 and css(d, "#ack-nos")[0].get_attribute("value") == "sonic"
    click(d, "#ack-confirm")  # no name yet
    wait_until_sync(
        lambda: "acked_by" in css(d, "#flash")[0].text, timeout=30, what="the 422 naming acked_by"
    )
    assert "422" in css(d, "#flash")[0].text
    css(d, "#ack-by")[0].send_keys("console-e2e")
    shot(d, "14-fabric-switch-ack")

    click(d, "#ack-confirm")
    wait_until_sync(
        lambda: "acknowledged" in css(d, "#flash")[0].text, timeout=30, what="the ack to be accepted"
    )
    wait_until_sync(
        lambda: texts(d, "#cfg-mgmt") == ["198.18.0.0/23"],
        timeout=30,
        what="the page to show the new management subnet",
    )
    stored = httpx.get(system.url() + "/controlnode/fabric-config", headers=admin, timeout=30).json()
    assert stored["management_cidr"] == "198.18.0.0/23"
