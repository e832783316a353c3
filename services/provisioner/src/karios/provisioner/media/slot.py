"""Constant-size boot media, the pure part: the per-host slot and the served byte ranges.

One base ISO per (kernel, initrd, kernel line, serial console, label) carries a fixed-size file
``/karios/host.img`` (:data:`SLOT_SIZE` bytes, zeros) that both boot loaders load as a second
initrd. A job's medium is that base with the slot's bytes replaced by the job's overlay (a gzip'd
newc cpio, zero-padded — the kernel's initramfs unpacker skips zeros between archives). Nothing
here does I/O: the reader and the HTTP response are in :mod:`karios.provisioner.media.serve`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from email.utils import formatdate

from karios.common.errors import PermanentFailure
from karios.provisioner.media.cpio import gzip_overlay

SLOT_SIZE = 256 * 1024
SLOT_PATH = "/karios/host.img"  # inside the ISO (ISO 9660 + Rock Ridge name)
SENTINEL = b"KARIOS-SLOT-v1\n\0"  # fills the slot while the base is built, so its offset is checked
RECORD_VERSION = 1


@dataclass(frozen=True)
class BaseLayout:
    """Where the slot of one base ISO is: ``offset`` .. ``offset + size`` of ``iso_size`` bytes."""

    key: str
    iso_size: int
    offset: int
    size: int

    def to_json(self) -> str:
        return json.dumps(
            {"key": self.key, "iso_size": self.iso_size, "offset": self.offset, "size": self.size}
        )

    @classmethod
    def from_json(cls, text: str) -> BaseLayout:
        d = json.loads(text)
        return cls(str(d["key"]), int(d["iso_size"]), int(d["offset"]), int(d["size"]))


def render_slot(overlay: dict[str, str], size: int = SLOT_SIZE) -> bytes:
    """A host's overlay as the slot's payload (the rest of the slot stays zeros)."""
    payload = gzip_overlay(overlay)
    if len(payload) > size:
        raise PermanentFailure(
            f"medium: the host's files take {len(payload)} bytes compressed; the slot holds {size}"
        )
    return payload


def encode_record(base_key: str, payload: bytes, base_path: str = "") -> bytes:
    """The per-job file: one JSON line naming its base (key, and where it was), then the payload."""
    head = {"v": RECORD_VERSION, "base": base_key, "path": base_path}
    return json.dumps(head).encode() + b"\n" + payload


def decode_record(data: bytes) -> tuple[str, str, bytes]:
    """(base key, base path as recorded, slot payload) of a per-job file."""
    head, sep, payload = data.partition(b"\n")
    meta = json.loads(head) if sep else {}
    if meta.get("v") != RECORD_VERSION or not isinstance(meta.get("base"), str):
        raise ValueError("not a medium record")
    return meta["base"], str(meta.get("path") or ""), payload


def base_key(parts: dict[str, object]) -> str:
    """A stable name of a base ISO from everything that goes into it."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def etag(base: str, payload: bytes) -> str:
    return f'"{base[:12]}-{hashlib.sha256(payload).hexdigest()[:20]}"'


def http_date(ts: float) -> str:
    return formatdate(ts, usegmt=True)


def segments(start: int, end: int, layout: BaseLayout, payload: bytes) -> list[tuple[str, int, int]]:
    """Bytes ``start..end`` (inclusive) of the patched medium as pieces to send, in order:
    ``("base", offset, length)`` read from the base file, ``("slot", offset_in_slot, length)``
    taken from the payload (zeros past its end)."""
    out: list[tuple[str, int, int]] = []
    s0, s1 = layout.offset, layout.offset + layout.size  # slot [s0, s1)
    pos, stop = start, end + 1
    while pos < stop:
        if pos < s0:
            n = min(stop, s0) - pos
            out.append(("base", pos, n))
        elif pos < s1:
            n = min(stop, s1) - pos
            out.append(("slot", pos - s0, n))
        else:
            n = stop - pos
            out.append(("base", pos, n))
        pos += n
    return out


def slot_bytes(payload: bytes, offset: int, length: int) -> bytes:
    """``length`` bytes of the zero-padded slot from ``offset``."""
    piece = payload[offset : offset + length]
    return piece + bytes(length - len(piece))
