"""The qemu harness's command line and disk markers (no VM started)."""

from __future__ import annotations

from pathlib import Path

from tests.lab.vm import MIB, VM, Disk, make_disk, read_marker, write_marker


def test_argv_restricts_network_and_attaches_every_bus(tmp_path: Path) -> None:
    vm = VM(
        tmp_path,
        iso=tmp_path / "m.iso",
        disks=[
            Disk(tmp_path / "a", bus="virtio"),
            Disk(tmp_path / "b", bus="ahci"),
            Disk(tmp_path / "c", bus="nvme"),
        ],
        guestfwd={"10.0.2.100:8080": 18080},
        hostfwd={2222: 22},
    )
    a = " ".join(vm.argv())
    assert "-accel tcg" in a and "restrict=on" in a
    assert "guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:18080" in a
    assert "hostfwd=tcp:127.0.0.1:2222-:22" in a
    assert (
        "-device ahci,id=ahci" in a
        and "ide-hd,drive=d1,bus=ahci.1" in a
        and "nvme,serial=karios2,drive=d2" in a
    )
    assert "discard=unmap" in a and "-boot once=d" in a and "-no-reboot" not in a


def test_markers_at_both_ends(tmp_path: Path) -> None:
    img = make_disk(tmp_path / "d.img", 8 * MIB)
    write_marker(img, "FIRST")
    write_marker(img, "LAST", where="last")
    assert read_marker(img).startswith(b"FIRST") and read_marker(img, "last").startswith(b"LAST")
    assert read_marker(img, "last").count(b"\0") == MIB - 4
