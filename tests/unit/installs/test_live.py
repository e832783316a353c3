"""The live image cache: what is reused, where packages come from."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from karios.provisioner.install.live import AptSource, ImageSettings, LiveImages, live_images_for


def test_built_artifacts_are_reused_not_rebuilt(tmp_path: Path) -> None:
    images = LiveImages(tmp_path)
    a = images.artifacts("bookworm")
    a.kernel.parent.mkdir(parents=True)
    for p in (a.kernel, a.initrd, a.root_archive):
        p.write_bytes(b"x")
    assert images.ready("bookworm")
    if not images.tools_missing():
        assert images.build("bookworm") == {}  # nothing to do: no mmdebstrap run
    assert a.root_archive.read_bytes() == b"x"


def test_wipe_needs_only_the_live_environment(tmp_path: Path) -> None:
    images = LiveImages(tmp_path)
    a = images.artifacts("trixie")
    a.kernel.parent.mkdir(parents=True)
    a.kernel.write_bytes(b"k")
    a.initrd.write_bytes(b"i")
    assert not images.ready("trixie")  # no root archive yet
    if not images.tools_missing():
        assert images.build("trixie", with_root=False) == {}


def test_package_source_precedence() -> None:
    own = ImageSettings(mirror="http://10.0.0.9/debian", proxy="http://10.0.0.9:3142")
    assert AptSource.for_config(own, "deb.example", "/debian", "http://p:1") == AptSource(
        "http://10.0.0.9/debian", "http://10.0.0.9:3142"
    )
    inherited = AptSource.for_config(ImageSettings(), "mirror.example:8080", "/debian", "http://p:1")
    assert inherited == AptSource("http://mirror.example:8080/debian", "http://p:1")
    assert inherited.args() == ['--aptopt=Acquire::http::Proxy "http://p:1"']
    assert AptSource.for_config(ImageSettings(), "", "/debian").args() == []


def test_images_dir_from_the_provisioner_config(tmp_path: Path) -> None:
    cfg = SimpleNamespace(
        cache_dir=tmp_path, images_dir=None, mirror_host="deb.debian.org", mirror_dir="/debian"
    )
    images = live_images_for(cfg, ImageSettings())
    assert images.images_dir == tmp_path / "images"
    assert images.source.mirror == "http://deb.debian.org/debian"
