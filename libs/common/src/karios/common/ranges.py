"""The one ``Range: bytes=…`` parser (RFC 9110 §14): pure, total, for every ranged download.

What a header gets (the same answer wherever a file is served with ranges):

- absent, empty, another unit, several ranges, or not the grammar (a non-ASCII digit such as
  ``²``, ``last < first``, stray text) → ``None``: the header is ignored and the whole file is
  sent with 200 (RFC 9110 §14.2 lets a server ignore a ``Range`` it does not serve; it never
  makes a request fail);
- ``bytes=a-b``, ``bytes=a-``, ``bytes=-n`` → ``(start, end)`` inclusive, ``end`` clamped to the
  last byte (206);
- a valid range that selects nothing (``a`` at or past the end, ``-0``, any range of an empty
  file) → :class:`RangeNotSatisfiable` (416 with ``Content-Range: bytes */size``).

Numbers are ASCII digits only and are never converted past :data:`MAX_DIGITS` significant digits:
a longer number is larger than any file, so it means "past the end" (a first position), "to the
end" (a last position) or "all of it" (a suffix length). Whitespace around ``=`` and the numbers
is tolerated. :class:`RangeNotSatisfiable` is the only exception this module raises.
"""

from __future__ import annotations

import re

#: Significant digits converted to an int: 10**18 bytes is more than any file served.
MAX_DIGITS = 18
#: A header longer than this is not a single byte range (whatever it holds): ignored unread.
MAX_HEADER = 256

_SPEC = re.compile(r"[ \t]*([0-9]*)[ \t]*-[ \t]*([0-9]*)[ \t]*", re.ASCII)
_HUGE = 10**MAX_DIGITS


class RangeNotSatisfiable(Exception):
    """A syntactically valid range that selects no byte of the file (answered with 416)."""


def _number(digits: str) -> int:
    """ASCII digits → int, saturating at 10**MAX_DIGITS (never an int() of thousands of digits)."""
    significant = digits.lstrip("0")
    return _HUGE if len(significant) > MAX_DIGITS else int(significant or "0")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``Range`` header → ``(start, end)`` inclusive, ``None`` (serve it all), or
    :class:`RangeNotSatisfiable` — the rules are in the module's docstring."""
    if not header or len(header) > MAX_HEADER:
        return None
    unit, eq, spec = header.partition("=")
    if not eq or unit.strip(" \t").lower() != "bytes":
        return None
    m = _SPEC.fullmatch(spec)
    if m is None:  # also every multi-range: a comma is not in the grammar of one
        return None
    first, last = m.groups()
    if not first and not last:
        return None
    if not first:  # suffix: the last n bytes
        n = _number(last)
        if n == 0 or size <= 0:
            raise RangeNotSatisfiable
        return max(0, size - n), size - 1
    start = _number(first)
    end = _number(last) if last else _HUGE
    if end < start:
        return None  # invalid (RFC 9110 §14.1.1): ignored
    if start >= size:
        raise RangeNotSatisfiable
    return start, min(end, size - 1)


def content_range(span: tuple[int, int] | None, size: int) -> str:
    """The ``Content-Range`` of a 206 (``bytes a-b/size``) or a 416 (``span=None``: ``bytes */size``)."""
    return f"bytes */{size}" if span is None else f"bytes {span[0]}-{span[1]}/{size}"
