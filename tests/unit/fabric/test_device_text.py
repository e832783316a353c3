"""Issue 23 items 7 and 10: free text that lands in a switch or node configuration is refused at
the API models (422 naming the field), again by the stored-config rules, and a row stored before
these rules still loads; /plan takes the names of /fabric-config and refuses unknown fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from karios.common import devicetext
from karios.common.contracts.fabric import (
    FabricConfigFields,
    FabricConfigInput,
    FabricConfigView,
    FabricPlanRequest,
)
from karios.common.errors import ValidationFailed
from karios.fabric_worker.config import rules
from karios.fabric_worker.config.plan import plan_fabric
from karios.fabric_worker.config.rules import RuleContext

INJECTED = "x\nrouter bgp 1\n neighbor 6.6.6.6 remote-as 1\n"
# Every value that could carry a second line, a comment, a second token or a huge blob.
HOSTILE = [
    ("newline", INJECTED),
    ("carriage return", "leaf\rhostname evil"),
    ("NUL", "leaf\x00"),
    ("tab", "leaf\t01"),
    ("space", "leaf 01"),
    ("unicode line separator", "leaf\u2028router bgp 1"),
    ("unicode paragraph separator", "leaf\u2029x"),
    ("100 KB", "a" * 100_000),
    ("leading !", "!leaf"),
    ("leading #", "#leaf"),
    ("trailing newline", "leaf-01\n"),
    ("non-ASCII letter", "leaf-\u00e9"),
]
NAME_ONLY = [  # names refuse these too; interface names take '.', '_' and a leading digit
    ("dot (an FQDN)", "leaf.example.com"),
    ("underscore", "leaf_01"),
    ("leading hyphen", "-leaf"),
    ("trailing hyphen", "leaf-"),
    ("64 characters", "a" * 64),
]
IFNAME_ONLY = [
    ("slash", "eth0/1"),
    ("colon (alias)", "eth0:1"),
    ("16 characters", "e" * 16),
    ("leading hyphen (an option)", "-eth1"),
    ("'.'", "."),
]
SECRETS = [
    ("newline", "pass\nword"),
    ("NUL", "pass\x00word"),
    ("CR", "pass\rword"),
    ("tab", "pass\tword"),
    ("space", "two words"),
    ("unicode line separator", "pass\u2028word"),
    ("non-ASCII", "pass\u00e9word"),
    ("100 KB", "k" * 100_000),
]


def _refused(model, body: dict, field: str) -> str:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(body)
    errors = exc.value.errors()
    assert [e["loc"] for e in errors] == [(field,)], errors
    return errors[0]["msg"]


@pytest.mark.parametrize("model", [FabricConfigInput, FabricPlanRequest])
@pytest.mark.parametrize(("case", "value"), HOSTILE + NAME_ONLY, ids=[c for c, _ in HOSTILE + NAME_ONLY])
def test_a_switch_name_outside_the_hostname_grammar_is_refused_naming_it(model, case, value):
    msg = _refused(model, {"fabric_switch_name": value}, "fabric_switch_name")
    assert len(msg) < 300 and "router bgp" not in msg  # says why, never echoes the value


@pytest.mark.parametrize("model", [FabricConfigInput, FabricPlanRequest])
@pytest.mark.parametrize(("case", "value"), HOSTILE + IFNAME_ONLY, ids=[c for c, _ in HOSTILE + IFNAME_ONLY])
def test_an_interface_outside_the_linux_ifname_grammar_is_refused_naming_it(model, case, value):
    _refused(model, {"ospf_fabric_interface": value}, "ospf_fabric_interface")


@pytest.mark.parametrize("field", ["bgp_password", "ospf_auth_key"])
@pytest.mark.parametrize(("case", "value"), SECRETS, ids=[c for c, _ in SECRETS])
def test_a_secret_outside_printable_ascii_is_refused_without_echoing_it(field, case, value):
    msg = _refused(FabricConfigInput, {field: value}, field)
    assert "word" not in msg and "kkkk" not in msg


def test_secret_length_limits_are_the_documented_ones():
    FabricConfigInput(bgp_password="p" * 80, ospf_auth_key="k" * 64)  # TCP-MD5 80, HMAC 64
    assert "80" in _refused(FabricConfigInput, {"bgp_password": "p" * 81}, "bgp_password")
    assert "64" in _refused(FabricConfigInput, {"ospf_auth_key": "k" * 65}, "ospf_auth_key")
    FabricConfigInput(bgp_password="!#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")  # printable, mid-line: fine


def test_acked_by_is_one_line_of_text():
    FabricConfigInput(acked_by="Olga Ops <olga@example.com>")
    for bad in ("olga\nroot", "olga\x00", "o" * 129, "olga\u2028x"):
        _refused(FabricConfigInput, {"acked_by": bad}, "acked_by")


@pytest.mark.parametrize("name", ["leaf-01", "rr", "L", "spine1", "a" * 63, ""])
def test_hostnames_every_nos_accepts_pass(name):
    assert FabricConfigInput(fabric_switch_name=name).fabric_switch_name == name
    assert FabricPlanRequest(fabric_switch_name=name).fabric_switch_name == name


@pytest.mark.parametrize("iface", ["eth1", "enp65s0f1", "br-underlay", "bond0.100", "e" * 15, "1gbe", ""])
def test_linux_interface_names_pass(iface):
    assert FabricConfigInput(ospf_fabric_interface=iface).ospf_fabric_interface == iface


def test_messages_say_which_character_is_wrong():
    assert "a newline (U+000A)" in (devicetext.switch_name_problem(INJECTED) or "")
    assert "LINE SEPARATOR (U+2028)" in (devicetext.ifname_problem("a\u2028b") or "")
    assert "'/' (U+002F)" in (devicetext.ifname_problem("eth0/1") or "")


# -- the stored-config rules: the same grammar, and old rows still load ------------------------
GOOD = {
    "as": 65000,
    "fabric_switch_nos": "eos",
    "management_cidr": "192.168.111.0/24",
    "router_id_base": "10.255.0.1",
    "router_id_prefix_len": 24,
    "vxlan_mtu": 9216,
}


@pytest.mark.parametrize(
    ("field", "value"), [("fabric_switch_name", INJECTED), ("ospf_fabric_interface", "eth0:1")]
)
def test_a_row_stored_before_the_rules_loads_and_is_refused_on_its_next_write(field, value):
    stored = FabricConfigFields.model_validate({**GOOD, field: value})  # the read path never checks
    view = FabricConfigView.model_validate(stored.model_dump(by_alias=True))
    assert getattr(view, field) == value  # GET still answers
    merged = rules.merge(stored, FabricConfigInput(vxlan_mtu=9000), {"vxlan_mtu"})
    with pytest.raises(ValidationFailed) as exc:
        rules.check(merged, RuleContext())
    assert exc.value.field == field
    fixed = rules.merge(
        stored, FabricConfigInput(**{field: "leaf-01" if "name" in field else "eth1"}), {field}
    )
    rules.check(fixed, RuleContext())  # sending a good value repairs it


# -- /plan: the names of /fabric-config, and nothing unknown -----------------------------------
PLAN = {"fabric_switch_nos": "eos", "management_cidr": "192.168.111.0/24", "vxlan_mtu": 9216}


@pytest.mark.parametrize("unknown", ["underlay", "asn", "fabric_switch_nmae", "password"])
def test_plan_refuses_an_unknown_field_naming_it(unknown):
    _refused(FabricPlanRequest, {**PLAN, unknown: "x"}, unknown)


def test_plan_takes_the_fabric_config_names_and_keeps_the_seed_ones():
    by_seed = plan_fabric(
        FabricPlanRequest.model_validate({**PLAN, "local_as": 65010, "underlay_mode": "bgp"})
    )
    by_config = plan_fabric(FabricPlanRequest.model_validate({**PLAN, "as": 65010, "ospf_enabled": False}))
    assert by_seed.config.as_ == by_config.config.as_ == 65010
    assert (
        by_seed.underlay_mode == by_config.underlay_mode == "bgp" and by_config.config.ospf_enabled is False
    )
    assert by_seed.plan_hash == by_config.plan_hash
    both = FabricPlanRequest.model_validate({**PLAN, "as": 65010, "local_as": 65010, "ospf_enabled": True})
    assert plan_fabric(both).underlay_mode == "ospf"
    req = FabricPlanRequest.model_validate({**PLAN, "as": 65010, "ospf_auto_ref_bw": 100000})
    assert FabricPlanRequest.model_validate(req.model_dump()) == req  # the bus round trip (by name)
    assert plan_fabric(req).config.ospf_auto_ref_bw == 100000


def test_plan_refuses_names_that_disagree():
    assert "disagrees" in _refused(FabricPlanRequest, {**PLAN, "as": 65010, "local_as": 65020}, "local_as")
    _refused(FabricPlanRequest, {**PLAN, "ospf_enabled": True, "underlay_mode": "bgp"}, "underlay_mode")
    with pytest.raises(ValidationFailed) as exc:
        plan_fabric(FabricPlanRequest.model_validate({**PLAN, "as": 23456}))
    assert exc.value.field == "as"
    with pytest.raises(ValidationFailed) as exc:
        plan_fabric(FabricPlanRequest.model_validate({**PLAN, "ospf_auto_ref_bw": 5_000_000}))
    assert exc.value.field == "ospf_auto_ref_bw"


def test_plan_takes_a_fabric_config_form_as_is():
    """A UI may post its /fabric-config form (as GET answered it) to /plan: router_id_cidr is
    decoded, read-only and ack-gate names are ignored, a password only means bgp_password_set."""
    form = {
        **PLAN,
        "as": 65000,
        "router_id_cidr": "198.19.1.1/24",
        "ospf_enabled": False,
        "external_route_reflector": True,
        "bgp_mode": "ibgp",
        "rollout_status": "ready",
        "physnet": None,
        "last_job": None,
        "bgp_password_is_set": True,
        "switch_acked": False,
        "acked_by": "",
        "bgp_password": "s3cret",
        "ospf_auth_key": "k3y",
    }
    req = FabricPlanRequest.model_validate(form)
    assert req.bgp_password_set is True and "s3cret" not in req.model_dump_json()
    p = plan_fabric(req)
    assert (p.config.router_id_base, p.config.router_id_prefix_len) == ("198.19.1.1", 24)
    assert (
        p.underlay_mode == "bgp" and "<bgp-password>" in p.switch_config and "s3cret" not in p.switch_config
    )
    with pytest.raises(ValidationFailed) as exc:
        plan_fabric(
            FabricPlanRequest.model_validate(
                {**PLAN, "router_id_cidr": "10.0.0.1/24", "router_id_prefix_len": 22}
            )
        )
    assert exc.value.field == "router_id_cidr"
