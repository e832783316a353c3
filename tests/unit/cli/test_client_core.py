"""Pure parts of the CLI client: the SSE wire parser, key=value bodies, --until, the context file."""

from __future__ import annotations

import stat

import pytest

from karios.cli.client.api import CliError
from karios.cli.client.context import ClientContext, load_context, save_context
from karios.cli.client.shared import body_from
from karios.cli.client.sse import parse_lines
from karios.cli.client.watch import JobLine, reached


def test_sse_lines_become_events_comments_become_none():
    wire = [
        "retry: 2000",
        ": connected",
        "",
        "id: 7",
        "event: job_queued",
        'data: {"data": {"job_id": "j1", "state": "queued"}}',
        "",
        "id: 8",
        "event: reconnect",
        "data: not json",
        "",
    ]
    out = list(parse_lines(iter(wire)))
    events = [e for e in out if e is not None]
    assert None in out
    assert [(e.id, e.name) for e in events] == [(7, "job_queued"), (8, "reconnect")]
    assert events[0].payload == {"job_id": "j1", "state": "queued"}
    assert events[1].data == {"text": "not json"}


def test_the_first_frames_id_is_a_resume_point_not_an_event():
    # The gateway's first frame: ": connected" then "id: N" with no data (the stream's position).
    wire = [": connected", "id: 41", "", "id: 42", "event: job_queued", "data: {}", ""]
    out = list(parse_lines(iter(wire)))
    assert [(e.id, e.name) for e in out if e is not None] == [(41, ""), (42, "job_queued")]


def test_key_value_pairs_are_yaml_typed_and_bad_pairs_name_themselves(tmp_path):
    f = tmp_path / "cfg.yaml"
    f.write_text("fabric_switch_nos: sonic\nvxlan_mtu: 1500\n")
    body = body_from(f, ["vxlan_mtu=9000", "management_cidr=10.0.0.0/24", "ospf_enabled=false", "name="])
    assert body == {
        "fabric_switch_nos": "sonic",
        "vxlan_mtu": 9000,
        "management_cidr": "10.0.0.0/24",
        "ospf_enabled": False,
        "name": "",
    }
    with pytest.raises(CliError, match="'oops': expected key=value"):
        body_from(None, ["oops"])
    f.write_text("- a list\n")
    with pytest.raises(CliError, match="expected a mapping"):
        body_from(f, [])


def test_until_follows_the_state_machine_order():
    assert reached("booting", "booting") and reached("completed", "booting")
    assert not reached("mounting", "booting") and not reached("failed", "booting")
    j = JobLine("j1")
    j.update({"state": "booting", "status": "running", "percent": 35}, until="booting")
    assert j.finished("booting") and not j.finished(None) and j.ended is not None


def test_the_context_file_is_private_and_env_overrides_it(tmp_path, monkeypatch):
    path = tmp_path / "k" / "config.json"
    monkeypatch.setenv("KARIOS_CONFIG", str(path))
    monkeypatch.delenv("KARIOS_URL", raising=False)
    monkeypatch.delenv("KARIOS_TOKEN", raising=False)
    save_context(ClientContext(url="http://gw:8080/", token="kt_secret", name="me"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ctx = load_context()
    assert (ctx.url, ctx.token, ctx.name) == ("http://gw:8080", "kt_secret", "me")
    assert "kt_secret" not in repr(ctx)
    monkeypatch.setenv("KARIOS_TOKEN", "kt_other")
    assert load_context().token == "kt_other"
