"""``karios fabric set`` through the switch ack gate (issue 23 item 8), as an operator runs it: the
CLI in a subprocess (``python -m karios.cli``, ``KARIOS_URL`` / ``KARIOS_TOKEN``) against the real
gateway and fabric worker.

Moving the VTEP pool of an OSPF fabric whose route reflector is the switch (``SWITCH_RR``) moves
the switch's BGP listen range: ``fabric set`` prints the EOS snippet, its diff, verify command and
hash, and the command to re-run, and exits 5 with nothing stored; the printed command, with
``--acked-by alice``, stores the change and the audit log names alice. ``--all-nos`` shows every
NOS (another NOS's re-run adds ``switch_nos=``), ``-o json`` the 409 as is, a wrong hash is a
fresh 409, ``--ack`` without ``--acked-by`` is refused before any call, and ``--skip-switch-ack``
works for fabric_admin only.
"""

from __future__ import annotations

import json
import re
import shlex

from tests.fixtures.cli import run_karios as karios
from tests.fixtures.fabric import OPERATOR_TOKEN, SWITCH_RR, sql

RERUN = re.compile(r"^\s*(karios fabric set .*--ack ([0-9a-f]{64}) --acked-by \S+)$", re.M)
MOVE = "router_id_cidr=10.254.0.1/23"


async def _audit(settings, after: int) -> list:
    return await sql(settings, "SELECT * FROM fabric.switch_ack_audit WHERE id > :a ORDER BY id", a=after)


async def _last_audit_id(settings) -> int:
    rows = await sql(settings, "SELECT coalesce(max(id), 0) AS n FROM fabric.switch_ack_audit")
    return rows[0]["n"]


async def test_fabric_set_shows_the_switch_snippet_and_the_ack_rerun_stores_it(fabric, settings):
    url = fabric.gateway.url
    assert (await fabric.post(SWITCH_RR)).status_code == 201
    seen = await _last_audit_id(settings)

    code, out, err = await karios(url, "fabric", "set", MOVE)
    assert code == 5, (out, err)
    assert "REQUIRES_SWITCH_RECONFIG_ACK" in err and err.count("\n") == 1, err
    assert "moves from 10.255.0.0/24 to 10.254.0.0/23" in out and "Nothing was stored" in out, out
    assert "== eos (the switch NOS of this configuration) ==" in out and "== sonic" not in out, out
    assert "+   bgp listen range 10.254.0.0/23 peer-group KARIOS-VTEPS remote-as 65000" in out, out
    assert "-   bgp listen range 10.255.0.0/24 peer-group KARIOS-VTEPS remote-as 65000" in out, out
    assert "[eos] verify with: show " in out and "add --all-nos" in out, out
    (line, digest), *more = RERUN.findall(out)
    assert more == [] and f"[eos] switch_snippet_hash: {digest}" in out, out
    assert line.startswith(f"karios fabric set {MOVE} --ack {digest} --acked-by "), line
    assert (await fabric.get()).json()["router_id_cidr"] == "10.255.0.1/24"  # nothing written

    # The hash printed is the API's own for the configured NOS.
    r = await fabric.post({"router_id_cidr": "10.254.0.1/23"})
    assert r.status_code == 409 and r.json()["details"]["switch_snippet_hash"] == digest

    # Every NOS: six sections, each with its own hash and re-run (switch_nos= for the others).
    code, out, _ = await karios(url, "fabric", "set", MOVE, "--all-nos")
    assert code == 5 and len(RERUN.findall(out)) == 6, out
    sonic = next(cmd for cmd, _h in RERUN.findall(out) if "switch_nos=sonic" in cmd)
    assert sonic.startswith(f"karios fabric set {MOVE} switch_nos=sonic --ack "), sonic

    # For scripts: the 409 as the gateway sent it.
    code, out, _ = await karios(url, "-o", "json", "fabric", "set", MOVE)
    assert code == 5 and json.loads(out)["details"]["switch_snippet_hash"] == digest, out

    # --ack needs --acked-by (refused before the call); a wrong hash is a fresh 409 naming it.
    code, _out, err = await karios(url, "fabric", "set", MOVE, "--ack", digest)
    assert code == 1 and "--acked-by" in err, err
    code, out, err = await karios(url, "fabric", "set", MOVE, "--ack", "0" * 64, "--acked-by", "alice")
    assert code == 5 and "does not match" in err and digest in out, (out, err)

    # The printed command, run by alice: stored, and the audit log names her.
    argv = [*shlex.split(line)[1:-1], "alice"]  # `karios` … `--acked-by` <alice>
    code, out, err = await karios(url, *argv)
    assert code == 0, (out, err)
    assert (await fabric.get()).json()["router_id_cidr"] == "10.254.0.1/23"
    audit = await _audit(settings, seen)
    assert [(a["acked_by"], a["switch_nos"], a["switch_snippet_hash"], a["skipped"]) for a in audit] == [
        ("alice", "eos", digest, False)
    ]

    # --skip-switch-ack: refused for an operator (exit 5, says why), honoured for fabric_admin.
    code, _out, err = await karios(
        url, "fabric", "set", "router_id_cidr=10.253.0.1/24", "--skip-switch-ack", token=OPERATOR_TOKEN
    )
    assert code == 5 and "fabric_admin" in err, err
    code, out, err = await karios(url, "fabric", "set", "router_id_cidr=10.253.0.1/24", "--skip-switch-ack")
    assert code == 0, (out, err)
    assert (await fabric.get()).json()["router_id_cidr"] == "10.253.0.1/24"
    assert (await _audit(settings, seen))[-1]["skipped"] is True
