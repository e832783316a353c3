"""The OS image catalog (issue 25 item 2, registration) through the real gateway and provisioner
on the real NATS and PostgreSQL, the sources served over HTTP on 127.0.0.1 and converted with
the real ``qemu-img`` and ``zstd``.

A qcow2 made here from a raw disk is registered, converted once and served as raw.zst whose
bytes are the raw disk's; a raw, a raw.gz and a root archive (tar.zst) come out as documented;
a wrong checksum, a corrupt compressed source, a qcow2 that is not one and a qcow2 with a
backing file (it would read a file of this host into the image) fail with the reason and leave
nothing served; bad input is a 422 naming the field; a taken name 409; delete removes the file.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN, REQUIRE
from tests.fixtures.cli import run_karios
from tests.fixtures.wait import wait_until

pytestmark = [pytest.mark.integration]
TOOLS = ("qemu-img", "zstd")


def _sha(data: bytes, algo: str = "sha256") -> str:
    return hashlib.new(algo, data).hexdigest()


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Iterator[tuple[str, dict[str, Path]]]:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        if REQUIRE:
            pytest.fail(f"{missing} not installed (tests/lab/setup.sh installs them) — CI requires them")
        pytest.skip(f"{missing} not installed (tests/lab/setup.sh installs them)")
    d = tmp_path_factory.mktemp("image-sources")
    raw = d / "disk.raw"
    # 8 MiB (a disk is whole sectors) with a recognisable pattern and a hole (qcow2 keeps only
    # the allocated clusters)
    head, tail = b"KARIOS-DISK" * 100_000, b"END" * 1000
    raw.write_bytes(head + bytes((8 << 20) - len(head) - len(tail)) + tail)
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(d / "disk.qcow2")], check=True
    )
    subprocess.run(
        ["qemu-img", "create", "-f", "qcow2", "-b", "/etc/hostname", "-F", "raw", str(d / "evil.qcow2")],
        check=True,
        capture_output=True,
    )
    (d / "disk.raw.gz").write_bytes(gzip.compress(raw.read_bytes()))
    subprocess.run(["zstd", "-q", "-f", str(raw), "-o", str(d / "disk.raw.zst")], check=True)
    (d / "broken.raw.zst").write_bytes((d / "disk.raw.zst").read_bytes()[:-64])
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as t:
        info = tarfile.TarInfo("etc/os-release")
        body = b'ID=debian\nVERSION_ID="12"\n'
        info.size = len(body)
        t.addfile(info, io.BytesIO(body))
    (d / "root.tar").write_bytes(tar.getvalue())
    subprocess.run(["zstd", "-q", "-f", str(d / "root.tar"), "-o", str(d / "root.tar.zst")], check=True)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(d))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    files = {p.name: p for p in d.iterdir()}
    yield f"http://127.0.0.1:{server.server_address[1]}", files
    server.shutdown()


@pytest.fixture
async def api(settings, serve, sources, tmp_path):
    images = tmp_path / "images"
    cfg = ProvisionerConfig(cache_dir=tmp_path / "cache", media_dir=tmp_path / "media", images_dir=images)
    prov = await serve(provisioner_app(settings, cfg))
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=60) as client:
        client.prov_url = prov.url  # type: ignore[attr-defined]
        client.images = images  # type: ignore[attr-defined]
        # this module's database may hold images of an earlier test: start from an empty catalog
        # (but for the images a VM test beside it may be installing: ``vm-…``)
        for item in (await client.get("/controlnode/images")).json()["items"]:
            if not item["name"].startswith("vm-"):
                await client.delete(f"/controlnode/images/{item['name']}")
        yield client


async def _register(api: httpx.AsyncClient, url: str, name: str, fmt: str, data: bytes, **extra) -> dict:
    body = {"name": name, "source_url": url, "format": fmt, "sha256": _sha(data), **extra}
    r = await api.post("/controlnode/images", json=body)
    assert r.status_code == 202, r.text
    view = r.json()
    assert view["state"] == "registering" and view["name"] == name
    return view


async def _settled(api: httpx.AsyncClient, name: str) -> dict:
    async def done() -> dict | None:
        view = (await api.get(f"/controlnode/images/{name}")).json()
        return view if view["state"] != "registering" else None

    return await wait_until(done, timeout=60, interval=0.2, what=f"image {name} settled")


async def test_a_qcow2_is_converted_once_to_raw_zst_and_served(api, sources) -> None:
    base, files = sources
    qcow2 = files["disk.qcow2"].read_bytes()
    raw = files["disk.raw"].read_bytes()
    await _register(api, f"{base}/disk.qcow2", "debian-cloud", "qcow2", qcow2, os_family="debian")
    view = await _settled(api, "debian-cloud")
    assert view["state"] == "ready", view
    assert view["whole_disk"] is True and view["served_format"] == "raw.zst"
    assert view["path"] == "catalog/debian-cloud.raw.zst"
    assert view["disk_bytes"] == len(raw)  # the qcow2's virtual size
    served = (await api.get(f"{api.prov_url}/images/{view['path']}")).content  # type: ignore[attr-defined]
    assert len(served) == view["size_bytes"] and _sha(served) == view["served_sha256"]
    out = subprocess.run(["zstd", "-dc"], input=served, capture_output=True, check=True).stdout
    assert out == raw, "the served raw.zst decompresses to the disk the qcow2 holds"
    listed = (await api.get("/controlnode/images")).json()["items"]
    assert [i["name"] for i in listed if not i["name"].startswith("vm-")] == ["debian-cloud"]


async def test_raw_gzip_and_root_archive_sources(api, sources) -> None:
    base, files = sources
    raw = files["disk.raw"].read_bytes()
    await _register(api, f"{base}/disk.raw", "plain", "raw", raw)
    gz = files["disk.raw.gz"].read_bytes()
    await _register(api, f"{base}/disk.raw.gz", "gzipped", "raw.gz", gz)
    tar = files["root.tar.zst"].read_bytes()
    await _register(api, f"{base}/root.tar.zst", "rootfs", "tar.zst", tar)
    plain, gzipped, rootfs = [await _settled(api, n) for n in ("plain", "gzipped", "rootfs")]
    assert (
        plain["state"] == "ready" and plain["served_format"] == "raw.zst" and plain["disk_bytes"] == len(raw)
    )
    assert gzipped["state"] == "ready" and gzipped["served_format"] == "raw.gz"
    assert gzipped["disk_bytes"] == len(raw) and gzipped["served_sha256"] == _sha(gz)  # kept as given
    assert rootfs["state"] == "ready" and rootfs["whole_disk"] is False and rootfs["disk_bytes"] == 0
    assert rootfs["served_sha256"] == _sha(tar)


async def test_bad_sources_fail_with_the_reason_and_leave_nothing_served(api, sources) -> None:
    base, files = sources
    qcow2 = files["disk.qcow2"].read_bytes()
    await _register(api, f"{base}/disk.qcow2", "wrong-sum", "qcow2", b"not these bytes")
    broken = files["broken.raw.zst"].read_bytes()
    await _register(api, f"{base}/broken.raw.zst", "truncated", "raw.zst", broken)
    raw = files["disk.raw"].read_bytes()
    await _register(api, f"{base}/disk.raw", "not-qcow2", "qcow2", raw)
    evil = files["evil.qcow2"].read_bytes()
    await _register(api, f"{base}/evil.qcow2", "backed", "qcow2", evil)
    await _register(api, f"{base}/nowhere.qcow2", "missing", "qcow2", b"")
    views = {n: await _settled(api, n) for n in ("wrong-sum", "truncated", "not-qcow2", "backed", "missing")}
    assert all(v["state"] == "failed" and not v["path"] for v in views.values()), views
    assert views["wrong-sum"]["message"].startswith(f"checksum: the source hashes to {_sha(qcow2)} (sha256)")
    assert views["truncated"]["message"].startswith("format: not a valid raw.zst")
    assert views["not-qcow2"]["message"] == "format: the source is 'raw', not qcow2"
    assert "backing file" in views["backed"]["message"]
    assert views["missing"]["message"] == "source_url: answered HTTP 404"
    catalog = api.images / "catalog"  # type: ignore[attr-defined]
    assert sorted(p.name for p in catalog.iterdir()) == [], "no file of a failed image is left"


async def test_bad_input_is_a_422_naming_the_field_a_taken_name_409_and_delete(api, sources) -> None:
    base, files = sources
    ok = {"name": "img", "source_url": f"{base}/disk.raw", "format": "raw", "sha256": "a" * 64}
    cases = {
        "name": {"name": "Bad Name"},
        "source_url": {"source_url": "ftp://127.0.0.1/disk.raw"},
        "sha256": {"sha512": "b" * 128},  # both given
        "sha512": {"sha256": "", "sha512": "xyz"},
    }
    for field, change in cases.items():
        r = await api.post("/controlnode/images", json={**ok, **change})
        assert r.status_code == 422 and r.json()["field"] == field, (field, r.text)
    r = await api.post("/controlnode/images", json={**ok, "source_url": "http://u:secret@127.0.0.1/x"})
    assert r.status_code == 422 and "secret" not in r.text
    r = await api.post("/controlnode/images", json={**ok, "format": "vmdk"})
    assert r.status_code == 422 and "format" in r.text
    raw = files["disk.raw"].read_bytes()
    await _register(api, f"{base}/disk.raw", "img", "raw", raw)
    again = await api.post("/controlnode/images", json={**ok, "sha256": _sha(raw)})
    assert again.status_code == 409 and again.json()["code"] == "IMAGE_EXISTS"
    view = await _settled(api, "img")
    served = api.images / view["path"]  # type: ignore[attr-defined]
    assert served.is_file()
    assert (await api.delete("/controlnode/images/img")).status_code == 200
    assert not served.exists()
    gone = await api.get("/controlnode/images/img")
    assert gone.status_code == 404 and gone.json()["code"] == "IMAGE_NOT_FOUND"
    viewer = await api.post("/controlnode/tokens", json={"name": "image-viewer", "role": "viewer"})
    token = {"Authorization": f"Bearer {viewer.json()['token']}"}
    assert (await api.get("/controlnode/images", headers=token)).status_code == 200
    assert (await api.post("/controlnode/images", json=ok, headers=token)).status_code == 403


async def test_the_cli_registers_waits_lists_and_deletes(api, sources) -> None:
    base, files = sources
    url = str(api.base_url).rstrip("/")
    raw = files["disk.raw"].read_bytes()
    code, out, err = await run_karios(
        url, "images", "register", "cli-disk", f"{base}/disk.raw", "--format", "raw", "--sha256", _sha(raw)
    )
    assert code == 0, err
    assert "cli-disk" in out and "ready" in out  # --wait (the default) followed it to the end
    code, out, err = await run_karios(
        url, "images", "register", "cli-bad", f"{base}/disk.raw", "--format", "raw", "--sha256", "0" * 64
    )
    assert code == 1 and "image cli-bad: checksum: the source hashes to" in err, (out, err)
    code, out, _ = await run_karios(url, "-o", "json", "images", "list")
    listed = {i["name"]: i["state"] for i in json.loads(out)["items"] if not i["name"].startswith("vm-")}
    assert code == 0 and listed == {
        "cli-disk": "ready",
        "cli-bad": "failed",
    }
    code, out, err = await run_karios(
        url, "images", "register", "x", "ftp://h/x", "--format", "raw", "--sha256", "a" * 64
    )
    assert code != 0 and "source_url" in err, (out, err)
    code, _, err = await run_karios(url, "images", "delete", "cli-disk")
    assert code == 0, err
    code, _, err = await run_karios(url, "images", "show", "cli-disk")
    assert code != 0 and "not in the catalog" in err, err
