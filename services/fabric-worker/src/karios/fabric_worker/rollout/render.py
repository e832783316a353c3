"""Pure rendering of a node's FRR files from the fabric intent (Jinja2, golden-tested)."""

from __future__ import annotations

import dataclasses
from functools import cache

import jinja2

from karios.common.devicetext import guard_render_values
from karios.fabric_worker.config.sessions import OSPF_NETWORK
from karios.fabric_worker.rollout.intent import FabricIntent, UnderlayProtocol

VTYSH_CONF = "service integrated-vtysh-config\n"

# Probe for OSPF HMAC-SHA authentication: `vtysh -C` parses it without running daemons. FRR
# 8.4 knows `cryptographic-algorithm hmac-sha-256` in key chains but not the OSPF interface
# command that uses it, so the probe needs both.
HMAC_SHA_PROBE_CONF = (
    "key chain karios-probe\n key 1\n  key-string probe\n  cryptographic-algorithm hmac-sha-256\n"
    " exit\nexit\ninterface lo\n ip ospf authentication key-chain karios-probe\nexit\n"
)


@dataclasses.dataclass(frozen=True)
class NodeRenderInput:
    hostname: str
    vtep_ip: str
    underlay_iface: str  # the node's underlay bridge/interface (OSPF runs on it)


@dataclasses.dataclass(frozen=True)
class RenderedFiles:
    """The three files of /etc/frr the rollout owns (contents contain secrets: never log)."""

    daemons: str
    frr_conf: str
    vtysh_conf: str = VTYSH_CONF

    def as_dict(self) -> dict[str, str]:
        return {"daemons": self.daemons, "frr.conf": self.frr_conf, "vtysh.conf": self.vtysh_conf}


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("karios.fabric_worker.rollout", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - FRR config text, not HTML
    )


def frr_log_path(template: str, hostname: str) -> str:
    """The node's FRR log file: ``{hostname}`` in the setting becomes the node's hostname."""
    return template.replace("{hostname}", hostname or "frr")


# A node resends an unacknowledged OSPF packet after this many seconds (FRR's default is 5). A
# node's first database-description packet is often ignored by a DR that has not yet seen its
# hello; with 5 s that costs every rolled-out node 5 s in ExStart (seen in the matrix lab). Local
# to the node: the interval need not match the switch's.
OSPF_RETRANSMIT_S = 2


def render_node_files(intent: FabricIntent, node: NodeRenderInput) -> RenderedFiles:
    """daemons, frr.conf and vtysh.conf for one node."""
    ctx = {
        "intent": intent,
        "ospf": intent.underlay is UnderlayProtocol.OSPF,
        "ospf_network": OSPF_NETWORK,  # the switch side renders the same (config/sessions.py)
        "ospf_retransmit": OSPF_RETRANSMIT_S,
        "hostname": node.hostname,
        "log_file": frr_log_path(intent.frr_log_file, node.hostname),
        "vtep_ip": node.vtep_ip,
        "underlay_iface": node.underlay_iface,
        "bgp_password": intent.bgp_password.get_secret_value() if intent.bgp_password else "",
        "ospf_key": intent.ospf_auth_key.get_secret_value() if intent.ospf_auth_key else "",
    }
    # No value may end a line of frr.conf (a hostname or interface name read from the node, a
    # stored secret): the API refuses such text, the renderer does not rely on it.
    guard_render_values(
        {k: v for k, v in ctx.items() if isinstance(v, str)} | dataclasses.asdict(node),
        {
            "bgp_password": "bgp_password",
            "ospf_key": "ospf_auth_key",
            "underlay_iface": "ospf_fabric_interface",
        },
    )
    env = _env()
    return RenderedFiles(
        daemons=env.get_template("daemons.j2").render(ctx),
        frr_conf=env.get_template("frr.conf.j2").render(ctx),
    )
