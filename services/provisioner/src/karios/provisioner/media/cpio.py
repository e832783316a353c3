"""A tiny ``newc`` cpio writer/reader (pure): the preseed overlay appended to the installer initrd."""

from __future__ import annotations

import gzip
import io


def _header(name: bytes, mode: int, size: int, ino: int) -> bytes:
    fields = [ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name) + 1, 0]
    return b"070701" + b"".join(b"%08X" % f for f in fields) + name + b"\0"


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


def newc_archive(files: dict[str, bytes], *, exec_suffixes: tuple[str, ...] = (".sh",)) -> bytes:
    """An uncompressed newc archive with the parent directories of every file."""
    out = io.BytesIO()
    ino = 1
    dirs: set[str] = set()
    for path in sorted(files):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                hdr = _header(d.encode(), 0o040755, 0, ino)
                out.write(hdr + _pad(len(hdr)))
                ino += 1
    for path, data in sorted(files.items()):
        mode = 0o100755 if path.endswith(exec_suffixes) else 0o100644
        hdr = _header(path.encode(), mode, len(data), ino)
        out.write(hdr + _pad(len(hdr)) + data + _pad(len(data)))
        ino += 1
    trailer = _header(b"TRAILER!!!", 0, 0, 0)
    out.write(trailer + _pad(len(trailer)))
    return out.getvalue()


def gzip_overlay(files: dict[str, str]) -> bytes:
    return gzip.compress(newc_archive({k: v.encode() for k, v in files.items()}), compresslevel=6, mtime=0)


def read_newc(data: bytes) -> dict[str, bytes]:
    """Every regular file of one or more concatenated newc archives (later entries win)."""
    files: dict[str, bytes] = {}
    pos = 0
    while pos + 110 <= len(data):
        if data[pos : pos + 6] != b"070701":
            # padding between concatenated archives
            pos += 1
            continue
        f = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = f[1], f[6], f[11]
        name_start = pos + 110
        name = data[name_start : name_start + namesize - 1].decode(errors="replace")
        body = name_start + namesize
        body += (4 - body % 4) % 4
        if name != "TRAILER!!!" and mode & 0o170000 == 0o100000:
            files[name] = data[body : body + size]
        pos = body + size
        pos += (4 - pos % 4) % 4
    return files


def read_initrd(initrd_gz: bytes) -> dict[str, bytes]:
    """Files of a gzip'd initrd made of concatenated gzip members (base + overlays)."""
    return read_newc(gzip.decompress(initrd_gz))
