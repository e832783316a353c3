"""The raw text an unreadable failure report leaves as its job's reason: one printable line."""

from __future__ import annotations

from karios.api_gateway.routes.jobs import RAW_REPORT_MAX, raw_report_text


def test_raw_report_text_is_one_bounded_printable_line() -> None:
    raw = b'{"message": "zstd\\ : bad\x00\x1b[31m\nnext\tline \xff\xc3 \xc3\xa9 \xe6\x97\xa5"}'
    assert raw_report_text(raw) == '{"message": "zstd\\ : bad [31m next line \ufffd\ufffd \xe9 \u65e5"}'
    long = raw_report_text(b"x" * 10_000 + b"\x01" * 5000)
    assert len(long) == RAW_REPORT_MAX and long.endswith("\u2026")
    assert raw_report_text(b"") == ""
