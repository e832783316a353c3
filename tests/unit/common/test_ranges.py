"""The one Range parser (``karios.common.ranges``): RFC 9110 single byte ranges, hostile headers.

Each hostile case here answered 500 from ``/media`` before (``isdigit()`` accepts ``²``, ``int()``
refuses it and any number of more than 4,300 digits).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from karios.common.ranges import MAX_HEADER, RangeNotSatisfiable, content_range, parse_range

SIZE = 4096


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("bytes=0-0", (0, 0)),
        ("bytes=0-", (0, 4095)),
        ("bytes=100-199", (100, 199)),
        ("bytes=4000-9999", (4000, 4095)),  # clamped to the end
        ("bytes=-100", (3996, 4095)),  # the last 100 bytes
        ("bytes=-99999", (0, 4095)),
        ("BYTES = 5-6", (5, 6)),
        ("bytes=0005-0006", (5, 6)),
        ("bytes=0-1,5-6", None),  # multi-range: the whole file
        ("bytes=0-1, 5-6", None),
        ("items=0-5", None),
        ("bytes 0-5", None),
        ("bytes=abc", None),
        ("bytes=5-1", None),  # last < first: invalid, ignored
        ("bytes=5000-10", None),  # invalid before unsatisfiable
        ("bytes=-", None),
        ("bytes=1-x", None),
        ("bytes=--5", None),
        ("bytes=1-2-3", None),
        # non-ASCII digits are not digits here (each was a 500)
        ("bytes=²-5", None),
        ("bytes=1-³", None),
        ("bytes=-¹", None),
        ("bytes=١-٥", None),  # Arabic-Indic
        ("bytes=１-５", None),  # fullwidth
        ("bytes=\x00-5", None),
        # huge numbers: never converted, larger than any file
        ("bytes=0-" + "9" * 5000, None),  # too long a header: ignored unread
        ("bytes=0-" + "9" * 200, (0, 4095)),
        ("bytes=-" + "9" * 200, (0, 4095)),
        ("bytes=" + "0" * 100 + "7-" + "0" * 100 + "9", (7, 9)),  # leading zeros are not size
    ],
)
def test_parse_range(header: str | None, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, SIZE) == expected


@pytest.mark.parametrize(
    "header",
    [
        "bytes=4096-",
        "bytes=5000-6000",
        "bytes=4096-4097",
        "bytes=-0",
        "bytes=-000",
        "bytes=" + "9" * 200 + "-",
    ],
)
def test_unsatisfiable_ranges(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, SIZE)


def test_the_5000_digit_number_of_the_report_is_not_a_500() -> None:
    # what the tester sent: 5,000 digits, not a valid int() in CPython (limit 4,300)
    assert parse_range("bytes=" + "1" * 5000 + "-", SIZE) is None  # past MAX_HEADER: ignored
    with pytest.raises(RangeNotSatisfiable):  # within the header bound: past the end
        parse_range("bytes=" + "1" * (MAX_HEADER - 7) + "-", SIZE)


@pytest.mark.parametrize("header", ["bytes=0-", "bytes=-5", "bytes=0-0"])
def test_an_empty_file_satisfies_no_range(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, 0)


def test_content_range() -> None:
    assert content_range((5, 9), SIZE) == "bytes 5-9/4096"
    assert content_range(None, SIZE) == "bytes */4096"


def _check(header: str, size: int) -> None:
    try:
        span = parse_range(header, size)
    except RangeNotSatisfiable:
        return
    if span is not None:
        start, end = span
        assert 0 <= start <= end < size


_DIGITS = st.text(alphabet=st.sampled_from("0123456789²³¹١５ "), max_size=30)


@settings(max_examples=600, deadline=None)
@given(header=st.text(max_size=300), size=st.integers(min_value=0, max_value=2**40))
def test_any_header_is_a_span_none_or_416(header: str, size: int) -> None:
    _check(header, size)


@settings(max_examples=600, deadline=None)
@given(
    unit=st.sampled_from(["bytes", "BYTES", " bytes ", "byte", ""]),
    first=_DIGITS,
    sep=st.sampled_from(["-", " - ", "--", "", ","]),
    last=_DIGITS,
    tail=st.sampled_from(["", ",0-1", " ", "x"]),
    size=st.integers(min_value=0, max_value=2**40),
)
def test_near_valid_headers_are_a_span_none_or_416(
    unit: str, first: str, sep: str, last: str, tail: str, size: int
) -> None:
    _check(f"{unit}={first}{sep}{last}{tail}", size)
