"""Issue 26: a healthy pull consumer's empty fetch made FastStream's task supervisor log an ERROR
with a traceback ("Task-20 raised an exception, retrying…", a plain TimeoutError from nats-py's
``_fetch_n``) on every start. That record is DEBUG now; any other task failure stays an ERROR."""

from __future__ import annotations

import logging

from karios.common.bus.runtime import _EmptyFetchRetry, _faststream_logger

MSG = (
    "Task-20 raised an exception, retrying...\nIf this behavior causes issues, you can disable it via "
    "setting the FASTSTREAM_SUPERVISOR_DISABLED env to 1."
)


def _record(exc: BaseException, msg: str = MSG) -> logging.LogRecord:
    return logging.LogRecord(
        "karios.bus.faststream", logging.ERROR, __file__, 1, msg, None, (type(exc), exc, None)
    )


def test_an_empty_fetch_retry_is_debug_and_anything_else_stays_an_error():
    f = _EmptyFetchRetry()
    logger = logging.getLogger("karios.bus.faststream")
    old = logger.level
    try:
        logger.setLevel(logging.INFO)
        rec = _record(TimeoutError())
        assert f.filter(rec) is False and rec.levelname == "DEBUG"  # dropped below DEBUG
        logger.setLevel(logging.DEBUG)
        rec = _record(TimeoutError())
        assert f.filter(rec) is True and (rec.levelno, rec.levelname) == (logging.DEBUG, "DEBUG")
        for other in (
            _record(ValueError("boom")),
            _record(TimeoutError(), "Task-3 raised an exception and won't be restarted."),
        ):
            assert f.filter(other) is True and other.levelno == logging.ERROR
    finally:
        logger.setLevel(old)


def test_the_bus_logger_carries_the_filter_once():
    _faststream_logger()
    logger = _faststream_logger()
    assert sum(isinstance(x, _EmptyFetchRetry) for x in logger.filters) == 1
