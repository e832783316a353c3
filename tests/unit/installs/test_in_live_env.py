"""The callbacks run inside the built live environment (its initramfs unpacked, ``chroot`` in a
mount namespace of its own): the JSON every report is built from, and a refused failure report
followed by the reduced one, with the live environment's own sh, awk and curl — not the host's.
The wipe's functions run there too (``test_wipe.py``, environment ``live``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from karios.provisioner.install.wipe import WipeMethod
from tests.fixtures.installs import LIVE_PATH, in_live
from tests.unit.installs.test_scripts import (
    MESSAGES,
    _Callbacks,
    _callbacks,
    _cfg,
    _ctx,
    _report_across_an_outage,
    check_report_across_an_outage,
)


def test_the_live_environment_has_mawk_and_no_jq(live_root: Path) -> None:
    """What the scripts meet there: awk is mawk (Debian's required awk), there is no jq, and the
    busybox applets are not linked over the real tools (dd, wipefs … are coreutils/util-linux)."""
    probe = (
        'readlink -f "$(command -v awk)"; awk -W version 2>&1 | head -n 1; '
        'command -v jq || echo no-jq; readlink -f "$(command -v dd)"; command -v busybox'
    )
    out = subprocess.run(
        in_live(live_root, probe), env={"PATH": LIVE_PATH}, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].endswith("/mawk") and out[1].startswith("mawk"), out
    assert out[2] == "no-jq", out
    assert out[3] == "/usr/bin/dd" and out[4].endswith("/busybox"), out


def test_callback_json_inside_the_live_environment(tmp_path: Path, live_root: Path) -> None:
    fns = _callbacks(WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx()))
    env = {"PATH": LIVE_PATH, **{f"V{i}": v for i, v in enumerate(MESSAGES)}}
    for fn in ("json_str", "json_lines"):
        prog = fns + "".join(f'{fn} "$V{i}"; echo\n' for i in range(len(MESSAGES)))
        out = subprocess.run(in_live(live_root, prog), env=env, capture_output=True, check=True).stdout
        got = [json.loads(line) for line in out.decode().split("\n")[:-1]]
        if fn == "json_str":
            assert [g.encode() for g in got] == [m.encode() for m in MESSAGES]
        else:
            assert got == [m.removesuffix("\n").split("\n") if m else [] for m in MESSAGES]
    bad = subprocess.run(
        in_live(live_root, fns + 'json_str "$V"'),
        env={b"PATH": LIVE_PATH.encode(), b"V": b"\xff bad \xc3 cut \xe6\x97 \xed\xa0\x80 \xc3\xa9"},
        capture_output=True,
        check=True,
    ).stdout
    assert json.loads(bad) == "\ufffd bad \ufffd cut \ufffd\ufffd \ufffd\ufffd\ufffd é"


def test_zstd_failure_report_arrives_from_the_live_environment(tmp_path: Path, live_root: Path) -> None:
    """zstd's own words with their backslash, sent by the live environment's curl: the full report
    is valid JSON and accepted at once; when refused, the reduced one follows."""
    for answers, sent in (([], 1), ([422], 2)):
        srv = _Callbacks(answers)
        try:
            fns = _callbacks(WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx(callback_base=srv.url)))
            res = subprocess.run(
                in_live(live_root, fns + 'report_failed "$S" "$M" "$L"'),
                env={"PATH": LIVE_PATH, "S": "base-system", "M": MESSAGES[2], "L": "zstd: " + MESSAGES[2]},
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            srv.shutdown()
            srv.server_close()
        assert res.returncode == 0, res.stderr
        assert len(srv.got) == sent, srv.got
        first = json.loads(srv.got[0][2])
        assert first["message"] == MESSAGES[2] and first["log"] == ["zstd: " + MESSAGES[2]]
        assert json.loads(srv.got[-1][2])["state"] == "failed"


def test_failure_report_waits_for_a_server_that_is_down_then_up_in_the_live_environment(
    tmp_path: Path, live_root: Path
) -> None:
    """The retry with backoff as the installer runs it — the live environment's sh, curl, date and
    sleep: nothing listens at the callback URL, then the server answers 503 twice, then takes the
    full report; no try is more than the backoff's longest pause after the one before."""
    res, srv, up = _report_across_an_outage(tmp_path, lambda s: in_live(live_root, s), LIVE_PATH)
    check_report_across_an_outage(res, srv, up)
