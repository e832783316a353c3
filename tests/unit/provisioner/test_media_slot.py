"""The pure core of constant-size media: the slot payload, its record and patched pieces (the Range
parser: tests/unit/common/test_ranges.py).

The reference for every range is the patched medium built the slow, obvious way (base bytes with
the zero-padded payload written over the slot) and compared byte for byte.
"""

from __future__ import annotations

import itertools

import pytest

from karios.common.errors import PermanentFailure
from karios.provisioner.media.cpio import read_initrd
from karios.provisioner.media.slot import (
    BaseLayout,
    base_key,
    decode_record,
    encode_record,
    etag,
    render_slot,
    segments,
    slot_bytes,
)

BASE = bytes((i * 7 + 3) % 251 for i in range(4096))
LAYOUT = BaseLayout("k" * 24, iso_size=len(BASE), offset=2048, size=1024)
PAYLOAD = b"\x1f\x8b" + bytes(range(1, 200))  # shorter than the slot: zeros follow


def patched_reference(base: bytes, layout: BaseLayout, payload: bytes) -> bytes:
    slot = payload + bytes(layout.size - len(payload))
    return base[: layout.offset] + slot + base[layout.offset + layout.size :]


def assemble(start: int, end: int, layout: BaseLayout = LAYOUT, payload: bytes = PAYLOAD) -> bytes:
    out = b""
    for kind, off, n in segments(start, end, layout, payload):
        assert n > 0
        out += BASE[off : off + n] if kind == "base" else slot_bytes(payload, off, n)
    return out


# Every interesting boundary: the ends of the medium, of the slot, of the payload inside it.
EDGES = sorted(
    {
        0,
        1,
        LAYOUT.offset - 1,
        LAYOUT.offset,
        LAYOUT.offset + 1,
        LAYOUT.offset + len(PAYLOAD) - 1,
        LAYOUT.offset + len(PAYLOAD),
        LAYOUT.offset + LAYOUT.size - 1,
        LAYOUT.offset + LAYOUT.size,
        LAYOUT.offset + LAYOUT.size + 1,
        len(BASE) - 1,
    }
)


@pytest.mark.parametrize(("start", "end"), [(a, b) for a, b in itertools.product(EDGES, EDGES) if a <= b])
def test_every_range_across_the_slot_boundaries_matches_the_reference(start: int, end: int) -> None:
    ref = patched_reference(BASE, LAYOUT, PAYLOAD)
    assert assemble(start, end) == ref[start : end + 1]


def test_whole_medium_has_the_base_length_and_differs_only_in_the_slot() -> None:
    a, b = assemble(0, len(BASE) - 1), assemble(0, len(BASE) - 1, payload=b"other job")
    assert len(a) == len(b) == len(BASE)
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    assert diff and min(diff) >= LAYOUT.offset and max(diff) < LAYOUT.offset + LAYOUT.size
    assert a[: LAYOUT.offset] == BASE[: LAYOUT.offset] and a[LAYOUT.offset + LAYOUT.size :] == BASE[-1024:]


def test_slot_at_the_very_end_and_start_of_the_medium() -> None:
    for layout in (BaseLayout("k", 4096, 4096 - 1024, 1024), BaseLayout("k", 4096, 0, 1024)):
        ref = patched_reference(BASE, layout, PAYLOAD)
        for start, end in [(0, 4095), (0, 0), (4095, 4095), (1000, 3100)]:
            assert assemble(start, end, layout) == ref[start : end + 1]


def test_render_slot_is_the_overlay_as_gzipd_cpio_and_refuses_an_overflow() -> None:
    payload = render_slot({"karios/cb.sh": "TOKEN='t'\n", "preseed.cfg": "d-i x\n"})
    padded = payload + bytes(4096)  # as served: zeros after it (the kernel skips them too)
    assert read_initrd(padded) == {"karios/cb.sh": b"TOKEN='t'\n", "preseed.cfg": b"d-i x\n"}
    big = {"x": "".join(f"{i:x}" for i in range(200_000))}
    with pytest.raises(PermanentFailure, match="the slot holds 1024"):
        render_slot(big, size=1024)


def test_record_round_trip_and_rejects_foreign_files() -> None:
    rec = encode_record("abc", b"\x00\n\x01payload", "/var/cache/base.iso")
    assert decode_record(rec) == ("abc", "/var/cache/base.iso", b"\x00\n\x01payload")
    for bad in (b"", b"ISO9660", b'{"v": 99, "base": "x"}\n', b'{"v": 1}\n'):
        with pytest.raises(ValueError):
            decode_record(bad)


def test_etag_and_base_key_are_stable_and_per_job() -> None:
    assert etag("k" * 24, b"a") == etag("k" * 24, b"a") != etag("k" * 24, b"b") != etag("j" * 24, b"b")
    assert etag("k" * 24, b"a").startswith('"') and etag("k" * 24, b"a").endswith('"')
    assert base_key({"a": 1, "b": [2]}) == base_key({"b": [2], "a": 1}) != base_key({"a": 2, "b": [2]})
    layout = BaseLayout("k", 10, 2, 3)
    assert BaseLayout.from_json(layout.to_json()) == layout
