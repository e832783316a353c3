"""The root archive's manifest: what ``root.tar.zst`` takes once installed.

``<images_dir>/<suite>/root.json`` (``{"installed_bytes", "entries", "archive_bytes"}``) beside the
archive, read by the disk-size checks: the gateway's before the 202 (through
``q.provision.image``) and ``install.sh``'s before streaming. It is measured once from the archive
(a few seconds: one decompression, no extraction) the first time it is asked for — the image
method's ``prepare`` asks right after a build — and written atomically, so an archive built before
manifests existed gets one too. Kept out of ``install.live`` on purpose: the lab caches the built
images under a hash of that package's code, which this does not change.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import IO

ROOT_MANIFEST = "root.json"
_BLOCK = 4096
_LOCK = threading.Lock()  # one measurement at a time (the archive is read whole)


def tar_installed_bytes(stream: IO[bytes]) -> dict[str, int]:
    """What a tar stream takes once extracted onto ext4: every regular file rounded up to 4 KiB
    blocks, one block per directory (symlinks and device nodes live in their inodes); with the
    number of entries. Reads the stream once (``r|``: no seeking)."""
    total = entries = 0
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            entries += 1
            if m.isreg():
                total += -(-m.size // _BLOCK) * _BLOCK
            elif m.isdir():
                total += _BLOCK
    return {"installed_bytes": total, "entries": entries}


def root_manifest(suite_dir: Path) -> dict[str, int] | None:
    """The manifest of ``suite_dir/root.tar.zst``: read, or measured and written; None when there
    is no archive (or it cannot be decompressed)."""
    path, archive = suite_dir / ROOT_MANIFEST, suite_dir / "root.tar.zst"
    with _LOCK:
        if path.exists():
            try:
                return json.loads(path.read_text())  # type: ignore[no-any-return]
            except (OSError, ValueError):
                pass  # unreadable: measured again
        if not archive.exists():
            return None
        try:
            proc = subprocess.Popen(
                ["zstd", "-dcq", str(archive)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
        except OSError:  # no zstd here: the size stays unknown
            return None
        assert proc.stdout is not None
        try:
            manifest = tar_installed_bytes(proc.stdout)
        except tarfile.TarError:
            manifest = None
        finally:
            proc.stdout.close()
            proc.wait()
        if proc.returncode != 0 or manifest is None:
            return None
        manifest["archive_bytes"] = archive.stat().st_size
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(manifest, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return manifest
