"""The built medium: hybrid El Torito (BIOS + UEFI) base ISO shared by every host, the host's
overlay in the slot both boot loaders load as a second initrd, serial console, build time, disk use."""

from __future__ import annotations

import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from karios.bootapi.validate import debconf_checkonly
from karios.common.errors import ValidationFailed
from karios.provisioner.install import HostContext, Medium
from karios.provisioner.install.preseed import PreseedMethod
from karios.provisioner.install.preseed.render import hash_password
from karios.provisioner.media import MediaBuilder, boot_menus, debian_release, open_record, serial_port
from karios.provisioner.media.cpio import read_initrd
from karios.provisioner.media.slot import SLOT_PATH, SLOT_SIZE

BASE = "/tmp/karios-test-media-cache"


def host(**kw) -> HostContext:
    base = dict(
        job_id="job-1",
        token="tok-abc",
        callback_base="http://10.0.0.1:8080/controlnode",
        hostname="node1",
        bmc_ip="10.0.0.5",
        os_username="debian",
        password_hash=hash_password("adminadmin", salt="karios12"),
    )
    return HostContext(**{**base, **kw})


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    b = MediaBuilder(Path(BASE), tmp_path_factory.mktemp("media"))
    try:
        b.base()
        PreseedMethod().prepare("12", "bookworm")
    except Exception as exc:
        pytest.skip(f"Debian netboot/xorriso/grub tooling not installed: {exc}")
    return b


def extract(iso: Path, inside: str, out: Path) -> bytes:
    subprocess.run(
        ["xorriso", "-osirrox", "on", "-indev", str(iso), "-extract", inside, str(out)],
        check=True,
        capture_output=True,
    )
    return out.read_bytes()


def served_iso(builder: MediaBuilder, name: str, out: Path) -> Path:
    served = builder.open(name)
    assert served is not None
    return served.write_to(out)


def test_iso_is_hybrid_bios_uefi_with_preseed_in_the_slot(builder, tmp_path):
    medium = PreseedMethod().medium(host(disks=["/dev/sda", "/dev/sdb"], md_level=1))
    builder.build("job-x", medium)
    iso = served_iso(builder, "job-x", tmp_path / "x.iso")
    report = subprocess.run(
        ["xorriso", "-indev", str(iso), "-report_el_torito", "plain"], capture_output=True, text=True
    ).stdout
    assert "BIOS  y   none" in report and "UEFI  y   none" in report
    slot = extract(iso, SLOT_PATH, tmp_path / "host.img")
    assert len(slot) == SLOT_SIZE  # fixed size, zero-padded after the host's cpio
    inside = read_initrd(slot)
    assert inside["preseed.cfg"].decode() == medium.overlay["preseed.cfg"]
    assert b"tok-abc" in inside["karios/cb.sh"]
    # the installer's own initrd is the cached one, unchanged (grafted, not copied)
    assert extract(iso, "/install.amd/initrd.gz", tmp_path / "initrd.gz") == medium.initrd.read_bytes()
    pre = tmp_path / "preseed.cfg"
    pre.write_bytes(inside["preseed.cfg"])
    rc, out = debconf_checkonly(pre)
    assert rc == 0 and "warning" not in out.lower(), out


def test_both_boot_loaders_load_the_slot_as_a_second_initrd(builder, tmp_path):
    """BIOS (isolinux) and UEFI (GRUB, reading the ISO 9660 tree) load the same two initrds."""
    builder.build("job-menus", PreseedMethod().medium(host()))
    iso = served_iso(builder, "job-menus", tmp_path / "m.iso")
    isolinux = extract(iso, "/isolinux/isolinux.cfg", tmp_path / "isolinux.cfg").decode()
    grub = extract(iso, "/boot/grub/grub.cfg", tmp_path / "grub.cfg").decode()
    assert "initrd=/install.amd/initrd.gz,/karios/host.img " in isolinux
    assert "initrd /install.amd/initrd.gz /karios/host.img\n" in grub


def test_boot_menus_on_the_serial_console_bios_and_uefi(builder, tmp_path):
    """Default ttyS0; a vendor whose SOL is ttyS1 gets ttyS1 in both menus and on the kernel line."""
    medium = PreseedMethod().medium(host())
    builder.build("job-serial", medium, serial_console="ttyS1,115200n8")
    iso = served_iso(builder, "job-serial", tmp_path / "s.iso")
    isolinux = extract(iso, "/isolinux/isolinux.cfg", tmp_path / "isolinux.cfg").decode()
    grub = extract(iso, "/boot/grub/grub.cfg", tmp_path / "grub.cfg").decode()
    assert isolinux.splitlines()[0] == "SERIAL 1 115200"  # must be the first directive
    assert "serial --unit=1 --speed=115200" in grub
    assert "terminal_input serial console" in grub and "terminal_output serial console" in grub
    for menu in (isolinux, grub):
        line = next(x for x in menu.splitlines() if "auto=true" in x)
        # console= before "---": the installer copies it to the installed system too
        assert "console=tty0 console=ttyS1,115200n8 ---" in line, line
    plain = boot_menus(medium, "")
    assert "console=" not in plain["boot/grub/grub.cfg"] and "SERIAL" not in plain["isolinux/isolinux.cfg"]
    assert serial_port("ttyS0,115200n8") == (0, 115200) and serial_port("") is None


def test_any_methods_medium_is_written(builder, tmp_path):
    """The writer knows nothing of the method: kernel, initrd + overlay, args (no "---": console last)."""
    src = PreseedMethod().medium(host())
    medium = Medium(src.kernel, src.initrd, {"karios/run.sh": "#!/bin/sh\necho hi\n"}, ["quiet"], "live")
    builder.build("job-live", medium)
    iso = served_iso(builder, "job-live", tmp_path / "l.iso")
    inside = read_initrd(extract(iso, SLOT_PATH, tmp_path / "host.img"))
    assert inside["karios/run.sh"] == b"#!/bin/sh\necho hi\n"
    grub = extract(iso, "/boot/grub/grub.cfg", tmp_path / "grub.cfg").decode()
    assert "quiet console=tty0 console=ttyS0,115200n8\n" in grub


def test_hosts_share_one_base_and_differ_only_in_the_slot(builder, tmp_path):
    """Two hosts of one release: one base ISO, two slot records of a few KB, media that differ only
    inside the slot; the record is readable by its owner only (it holds the job token)."""
    bases_before = set(builder.base_dir.glob("*.iso"))
    a, b = (PreseedMethod().medium(host(job_id=j, token=f"tok-{j}", hostname=j)) for j in ("ha", "hb"))
    ra, rb = builder.build("job-ha", a), builder.build("job-hb", b)
    assert len(set(builder.base_dir.glob("*.iso")) - bases_before) <= 1
    sa, sb = builder.open("job-ha"), builder.open("job-hb")
    assert sa is not None and sb is not None and sa.base == sb.base and sa.size == sb.size
    assert ra.stat().st_size < 16 * 1024 and rb.stat().st_mode & 0o777 == 0o600
    ia, ib = sa.read(), sb.read()
    diff = [i for i in range(len(ia)) if ia[i] != ib[i]]
    assert diff and sa.layout.offset <= diff[0] and diff[-1] < sa.layout.offset + sa.layout.size
    assert sa.etag != sb.etag
    assert open_record(ra) is not None and open_record(ra).read(0, 4095) == ia[:4096]  # type: ignore[union-attr]
    builder.remove("job-ha")
    assert builder.open("job-ha") is None and not ra.exists() and builder.open("job-hb") is not None


def test_build_time_p50_p99_over_20_parallel_builds_and_disk_use(builder):
    medium = PreseedMethod().medium(host())
    builder.build("bench-warm", medium)  # the base exists from now on

    def one(i: int) -> float:
        t = time.perf_counter()
        builder.build(f"bench-{i}", medium)
        return time.perf_counter() - t

    with ThreadPoolExecutor(2) as pool:
        times = sorted(pool.map(one, range(20)))
    p50, p99 = statistics.median(times), times[-1]
    per_host = sum(builder.path_of(f"bench-{i}").stat().st_size for i in range(20)) / 20
    print(f"\nmedium build over 20 (2 in parallel): p50 {p50 * 1000:.1f} ms p99 {p99 * 1000:.1f} ms; "
          f"{per_host / 1024:.1f} KiB on disk per host")  # fmt: skip
    assert p50 < 1.0  # a few ms when idle: no xorriso run, no initrd copy
    assert per_host < 32 * 1024
    for i in range(20):
        builder.remove(f"bench-{i}")


def test_debian_versions():
    assert debian_release("12") == ("12", "bookworm")
    assert debian_release("13.1") == ("13", "trixie")
    assert debian_release("trixie") == ("13", "trixie")
    with pytest.raises(ValidationFailed) as e:
        debian_release("11")
    assert e.value.field == "debian_version"


def test_missing_release_installer_is_a_clear_error(tmp_path):
    method = PreseedMethod(netboot_root=tmp_path / "none")
    with pytest.raises(Exception, match="debian-installer-13-netboot-amd64"):
        method.prepare("13", "trixie")


def test_media_files_are_named_safely(builder):
    assert builder.path_of("abc").name == "abc.slot"


def test_a_medium_removed_while_it_is_built_is_never_published(builder, monkeypatch):
    """A job cancelled mid-build: the build's thread finishes, but the medium must not appear."""
    real = builder.base_for

    def base_then_remove(*a, **kw):  # type: ignore[no-untyped-def]
        got = real(*a, **kw)
        builder.remove("job-cancelled")  # the job ended while the build was running
        return got

    monkeypatch.setattr(builder, "base_for", base_then_remove)
    builder.build("job-cancelled", PreseedMethod().medium(host()))
    assert not builder.path_of("job-cancelled").exists() and builder.open("job-cancelled") is None
    monkeypatch.setattr(builder, "base_for", real)
    assert builder.build("job-cancelled", PreseedMethod().medium(host())).exists()  # a later build is fine
    builder.remove("job-cancelled")


def test_a_lost_base_or_a_foreign_file_is_no_medium(builder, tmp_path):
    fresh = MediaBuilder(builder.cache_dir, tmp_path / "media")
    fresh.build("job-ok", PreseedMethod().medium(host()))
    assert fresh.open("job-ok") is not None
    (tmp_path / "media" / "job-bad.slot").write_bytes(b"not a record")
    assert fresh.open("job-bad") is None and fresh.open("job-none") is None
    other_cache = MediaBuilder(tmp_path / "empty-cache", tmp_path / "media")
    assert other_cache.open("job-ok") is None  # its base is not in this cache: 404, never garbage


def test_a_legacy_per_job_iso_is_found_and_removed_with_its_job(builder, tmp_path):
    """Upgrade: an ISO written per job before slots existed is still served, and goes with its job."""
    fresh = MediaBuilder(builder.cache_dir, tmp_path / "media")
    (tmp_path / "media").mkdir()
    old = tmp_path / "media" / "job-old.iso"
    old.write_bytes(b"old medium")
    assert fresh.open("job-old") is None and fresh.legacy_iso("job-old") == old
    fresh.remove("job-old")
    assert not old.exists() and fresh.legacy_iso("job-old") is None


def test_replicas_sharing_a_cache_build_the_efi_image_once(tmp_path, monkeypatch):
    """Three replicas (MediaBuilders on one cache) starting together: one EFI image build, so
    one base-ISO key (its size and mtime are in the key: each replica's own build used to
    replace the file under the others, and three identical base ISOs were built)."""
    import threading

    import karios.provisioner.media as media

    builds: list[int] = []
    gate = threading.Barrier(3)

    def slow_build(cache_dir: Path, efiboot: Path) -> None:
        builds.append(1)
        time.sleep(0.3)  # the others arrive meanwhile
        tmp = efiboot.with_suffix(".tmp")
        tmp.write_bytes(b"EFI" * 1000)
        tmp.replace(efiboot)

    monkeypatch.setattr(media, "make_efiboot", slow_build)
    monkeypatch.setattr(MediaBuilder, "tools_missing", lambda self: [])
    replicas = [MediaBuilder(tmp_path / "cache", tmp_path / f"media{i}") for i in range(3)]

    def start(b: MediaBuilder) -> tuple[int, int]:
        gate.wait()
        st = b.base().efiboot.stat()
        return st.st_size, st.st_mtime_ns

    with ThreadPoolExecutor(3) as pool:
        stamps = set(pool.map(start, replicas))
    assert len(builds) == 1 and len(stamps) == 1
