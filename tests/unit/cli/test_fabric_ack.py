"""``karios fabric set`` and the switch ack gate, the pure parts: the ack options' body fields, the
re-run command (shell-quoted, ack fields and ``switch_nos`` replaced), the 409 recognised and shown
per NOS with its hash. Through the real gateway: tests/integration/fabric/test_ack_cli.py."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import pytest
from rich.console import Console

from karios.cli.client.api import CliError
from karios.cli.client.fabric_ack import ACK_EXIT, ack_fields, needs_ack, rerun_command, show_ack_needed

H = "ab" * 32


def _gate() -> dict:
    snip = {
        nos: {
            "nos": nos,
            "snippet": f"[{nos}] router bgp 65000\n",
            "diff": "-old\n+new\n",
            "verify": f"show {nos}",
            "switch_snippet_hash": nos[0] * 64,
        }
        for nos in ("sonic", "eos")
    }
    return {
        "code": "REQUIRES_SWITCH_RECONFIG_ACK",
        "message": "the switch's BGP listen range moves",
        "field": "router_id_base",
        "details": {
            "old_listen_range": "10.255.0.0/24",
            "new_listen_range": "10.254.0.0/23",
            "switch_nos": "eos",
            "switch_snippet_hash": "e" * 64,
            "snippets": list(snip.values()),
        },
    }


def test_ack_options_become_the_api_fields_and_ack_needs_a_name():
    assert ack_fields("", "", False) == {}
    assert ack_fields(f" {H} ", "alice", False) == {
        "switch_acked": True,
        "switch_snippet_hash": H,
        "acked_by": "alice",
    }
    assert ack_fields("", "bob", True) == {"acked_by": "bob", "skip_switch_ack": True}
    with pytest.raises(CliError, match="--acked-by"):
        ack_fields(H, " ", False)


def test_rerun_command_keeps_the_fields_quoted_and_replaces_ack_fields_and_nos():
    pairs = ["router_id_cidr=10.254.0.1/23", "fabric_switch_name=leaf 01", "switch_acked=true", "acked_by=x"]
    cmd = rerun_command(pairs, Path("my cfg.yaml"), nos="", digest=H, acked_by="alice")
    assert shlex.split(cmd) == [
        "karios", "fabric", "set", "router_id_cidr=10.254.0.1/23", "fabric_switch_name=leaf 01",
        "--file", "my cfg.yaml", "--ack", H, "--acked-by", "alice",
    ]  # fmt: skip
    cmd = rerun_command([*pairs, "switch_nos=eos"], None, nos="sonic", digest=H, acked_by="alice")
    assert "switch_nos=sonic" in cmd and "switch_nos=eos" not in cmd


def test_only_the_gate_409_is_an_ack_and_it_shows_the_configured_nos_or_all():
    assert needs_ack(CliError("x", status=409, body=_gate())) is not None
    assert needs_ack(CliError("x", status=409, body={"code": "CONFLICT"})) is None
    assert needs_ack(CliError("x", status=422, body=_gate())) is None

    buf = io.StringIO()
    err = show_ack_needed(
        _gate(), Console(file=buf, width=40), pairs=["router_id_cidr=10.254.0.1/23"], file=None,
        all_nos=False, acked_by="alice", as_json=False,
    )  # fmt: skip
    out = buf.getvalue()
    assert err.code == ACK_EXIT and "REQUIRES_SWITCH_RECONFIG_ACK" in err.message
    assert "[eos] router bgp 65000" in out and "[sonic] router bgp" not in out  # no markup eaten
    assert f"karios fabric set router_id_cidr=10.254.0.1/23 --ack {'e' * 64} --acked-by alice" in out
    assert "add --all-nos" in out

    buf = io.StringIO()
    show_ack_needed(
        _gate(), Console(file=buf, width=40), pairs=[], file=None, all_nos=True, acked_by="alice",
        as_json=False,
    )  # fmt: skip
    out = buf.getvalue()
    assert f"switch_nos=sonic --ack {'s' * 64} --acked-by alice" in out and "[sonic] router bgp" in out
