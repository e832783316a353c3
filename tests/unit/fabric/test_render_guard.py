"""No text reaches a rendered configuration unchecked (issue 23, item 7), renderer side: a value
that could end a configuration line — whatever let it through (a row stored before the API's
rules, a hostname read from a node) — makes every renderer refuse, naming the field, for every
NOS, the gateway route reflector and the nodes' frr.conf. The API side (422 before anything is
stored) is tests/unit/fabric/test_device_text.py and tests/integration/fabric/test_config_text.py."""

from __future__ import annotations

import pytest

from karios.common.devicetext import UnsafeRenderValue
from karios.fabric_worker.config.render import (
    SWITCH_NOS,
    render_route_reflector_config,
    render_switch_config,
    route_reflector_context,
    switch_context,
)
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from tests.fixtures.fabric_matrix import Cell, cell_config, node_intent

INJECT = "x\nrouter bgp 1\n neighbor 6.6.6.6 remote-as 1"
HOSTILE = [INJECT, "a\rb", "a\x00b", "a\u2028router bgp 1", "a\x85b", "a\tb", "x" * 100 + "\n!"]


@pytest.mark.parametrize("nos", SWITCH_NOS)
@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_every_switch_rendering_refuses_a_line_breaking_name(nos: str, value: str) -> None:
    # FabricConfigFields is the read model: it loads what is stored, unchecked, like an old row.
    cfg = cell_config(Cell("ospf", "switch-rr", True), fabric_switch_nos=nos, fabric_switch_name=value)
    with pytest.raises(UnsafeRenderValue) as err:
        render_switch_config(switch_context(cfg))
    assert err.value.field == "fabric_switch_name" and err.value.http_status == 422
    assert "router bgp 1" not in str(err.value)  # the refusal never echoes the value


def test_a_clean_name_renders_and_no_text_spills_into_configuration() -> None:
    for nos in SWITCH_NOS:
        cfg = cell_config(Cell("ospf", "switch-rr", True), fabric_switch_nos=nos)
        plain = render_switch_config(switch_context(cfg.model_copy(update={"fabric_switch_name": "a"})))
        named = render_switch_config(switch_context(cfg.model_copy(update={"fabric_switch_name": "leaf-07"})))
        assert "leaf-07" in named
        # The name changes only the lines it stands on: as many lines, the same others.
        assert len(named.splitlines()) == len(plain.splitlines())
        changed = [b for a, b in zip(plain.splitlines(), named.splitlines(), strict=True) if a != b]
        assert changed and all("leaf-07" in ln for ln in changed), (nos, changed)


def test_the_gateway_route_reflector_and_the_nodes_refuse_line_breaks() -> None:
    cfg = cell_config(Cell("bgp", "gateway-rr", False))
    with pytest.raises(UnsafeRenderValue):
        render_route_reflector_config(route_reflector_context(cfg, port="eth0\nrouter bgp 1"))
    intent = node_intent(cfg, Cell("bgp", "gateway-rr", False))
    for node in (
        NodeRenderInput("node1\nrouter bgp 1", "10.255.0.1", "br-underlay"),
        NodeRenderInput("node1", "10.255.0.1", "br-underlay\u2028x"),
    ):
        with pytest.raises(UnsafeRenderValue):
            render_node_files(intent, node)
    assert (
        "router bgp 65000"
        in render_node_files(intent, NodeRenderInput("node1", "10.255.0.1", "br0")).frr_conf
    )
