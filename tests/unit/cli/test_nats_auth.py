"""The embedded NATS's credentials (issue 24, S5), without a server: the config file rendered from
``templates/nats-server.conf.j2`` (golden files), its quoting, the state directory's credentials
file (made once, 0600, kept), the command lines (no secret: ``ps`` shows them), the services'
settings (a ``SecretStr`` that never prints) and the bus's login."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from karios.cli.backup import _nats_members
from karios.cli.embedded import EmbeddedNats, NatsNode
from karios.cli.nats_auth import (
    CREDENTIALS_FILE,
    ClusterConf,
    CredentialsError,
    NatsCredentials,
    conf_str,
    load_or_create,
    render_config,
    write_private,
)
from karios.common.bus.runtime import Bus
from karios.common.settings import KariosSettings
from tests.fixtures.golden import assert_golden

GOLDEN = Path(__file__).parent / "golden"
FIXED = NatsCredentials("karios", "svc-Pass_word-1", "karios-route", "route-Pass_word-2")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_single_server_config_holds_the_services_login_only():
    text = render_config(FIXED)
    assert_golden(GOLDEN / "nats-server.conf", text)
    assert "cluster {" not in text and "routes" not in text


def test_a_cluster_node_config_holds_the_route_listener_login_and_routes_to_its_peers():
    text = render_config(FIXED, ClusterConf("karios", 6302, [6301, 6303]))
    assert_golden(GOLDEN / "nats-server-cluster.conf", text)
    assert text.count("nats-route://karios-route:route-Pass_word-2@127.0.0.1:") == 2
    assert '"127.0.0.1:6302"' in text and "@127.0.0.1:6302" not in text  # no route to itself


def test_config_strings_are_quoted_and_escaped_and_unprintables_refused_without_the_value():
    assert conf_str("a$b") == '"a$b"'  # quoted: no variable expansion
    assert conf_str('q"b\\s') == '"q\\"b\\\\s"'
    with pytest.raises(ValueError, match="printable ASCII") as err:
        conf_str("secret\nauthorization {}")
    assert "secret" not in str(err.value)


def test_generated_passwords_are_long_random_and_safe_in_urls_and_the_config():
    a, b = NatsCredentials.generate(), NatsCredentials.generate()
    assert a.password != b.password and a.route_password != b.route_password != a.password
    for pw in (*a.passwords, *b.passwords):
        assert len(pw) >= 40 and set(pw) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        )
    assert a.password not in repr(a) and a.route_password not in repr(a)


def test_the_credentials_file_is_made_once_0600_and_kept(tmp_path: Path):
    old = os.umask(0)  # a permissive umask must not matter
    try:
        first = load_or_create(tmp_path)
    finally:
        os.umask(old)
    path = tmp_path / CREDENTIALS_FILE
    assert _mode(path) == 0o600
    assert json.loads(path.read_text())["password"] == first.password
    assert load_or_create(tmp_path) == first  # kept: the next run has the same login
    path.chmod(0o644)  # made readable by someone: tightened again at the next start
    assert load_or_create(tmp_path) == first and _mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [CREDENTIALS_FILE]  # no temp file left


def test_a_damaged_credentials_file_is_an_error_naming_it_and_the_fix(tmp_path: Path):
    (tmp_path / CREDENTIALS_FILE).write_text('{"user": "karios", "password": "x"}')
    with pytest.raises(CredentialsError, match="remove it to generate new credentials") as err:
        load_or_create(tmp_path)
    assert CREDENTIALS_FILE in str(err.value) and '"x"' not in str(err.value)
    (tmp_path / CREDENTIALS_FILE).write_text(json.dumps({**FIXED.__dict__, "password": ""}))
    with pytest.raises(CredentialsError, match="empty or unusable"):
        load_or_create(tmp_path)


def test_write_private_is_0600_from_the_start_and_exclusive_keeps_an_existing_file(tmp_path: Path):
    target = tmp_path / "x.conf"
    write_private(target, "one")
    assert target.read_text() == "one" and _mode(target) == 0o600
    write_private(target, "two")
    assert target.read_text() == "two"
    write_private(target, "three", exclusive=True)
    assert target.read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.conf"]


def test_command_lines_name_the_config_file_and_hold_no_secret(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("karios.cli.embedded.nats_server_binary", lambda: "nats-server")
    nodes = [
        NatsNode(f"karios-n{i}", 4000 + i, 5000 + i, 6000 + i, tmp_path / "nats" / f"n{i}") for i in (1, 2)
    ]
    for node in nodes:
        node.store.mkdir(parents=True)
        node.write_config(nodes, FIXED)
    argv = nodes[0].argv(nodes, config=True)
    assert argv[argv.index("-c") + 1] == str(tmp_path / "nats" / "karios-n1.conf")
    assert "--routes" not in argv and "--cluster" not in argv  # a --cluster flag drops the file's login
    assert not any(pw in " ".join(argv) for pw in FIXED.passwords)
    conf = nodes[0].conf.read_text()
    assert (
        _mode(nodes[0].conf) == 0o600 and "nats-route://karios-route:route-Pass_word-2@127.0.0.1:5002" in conf
    )
    # Without credentials (the tests' plain server): the flags as before, no config file.
    assert "-c" not in nodes[0].argv(nodes) and "--routes" in nodes[0].argv(nodes)
    single = EmbeddedNats(tmp_path, FIXED)
    assert single.conf == tmp_path / "nats" / "nats-server.conf"


def test_the_backup_leaves_out_the_config_files_that_hold_the_credentials(tmp_path: Path):
    (tmp_path / "nats" / "jetstream" / "jetstream").mkdir(parents=True)
    (tmp_path / "nats" / "jetstream" / "jetstream" / "meta.inf").write_text("{}")
    for name in ("nats-server.conf", "karios-n1.conf", ".nats-server.conf.abc123", "nats-server.log"):
        (tmp_path / "nats" / name).write_text("x")
    (tmp_path / CREDENTIALS_FILE).write_text("{}")
    assert [p.name for p in _nats_members(tmp_path)] == ["meta.inf"]


def test_the_services_login_is_a_pair_and_the_password_never_prints(monkeypatch):
    monkeypatch.setenv("KARIOS_NATS_USER", "karios")
    monkeypatch.setenv("KARIOS_NATS_PASSWORD", "svc-Pass_word-1")
    s = KariosSettings(_env_file=None, dev_mode=True)  # type: ignore[call-arg]
    assert s.nats_user == "karios" and s.nats_password is not None
    assert s.nats_password.get_secret_value() == "svc-Pass_word-1"
    assert "svc-Pass_word-1" not in repr(s) and "svc-Pass_word-1" not in str(s.model_dump())
    bus = Bus.from_settings(s, "unit")
    assert bus.user == "karios" and "svc-Pass_word-1" not in repr(bus)
    monkeypatch.delenv("KARIOS_NATS_USER")
    with pytest.raises(ValidationError, match="KARIOS_NATS_USER and KARIOS_NATS_PASSWORD: set both") as err:
        KariosSettings(_env_file=None, dev_mode=True)  # type: ignore[call-arg]
    assert "svc-Pass_word-1" not in str(err.value)  # the error echoes no value read
    monkeypatch.setenv("KARIOS_NATS_USER", "karios")
    monkeypatch.delenv("KARIOS_NATS_PASSWORD")
    with pytest.raises(ValidationError, match="set both or neither"):
        KariosSettings(_env_file=None, dev_mode=True)  # type: ignore[call-arg]
    monkeypatch.setenv("KARIOS_NATS_USER", "")
    monkeypatch.setenv("KARIOS_NATS_PASSWORD", "")  # empty: unset (the external NATS as before)
    plain = KariosSettings(_env_file=None, dev_mode=True)  # type: ignore[call-arg]
    assert plain.nats_password is None and Bus.from_settings(plain, "unit").password is None
