"""What a node looks like right now: one read-only discovery command and its pure parser.

The same facts serve preflight (underlay resolution), apply (baseline, diff) and
post-deploy (checklist). The parser is tested against recorded output.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json

MANAGED_FILES = ("daemons", "frr.conf", "vtysh.conf")
# What Karios created on the node (:mod:`.ownership`): next to the files it describes.
RECORD_NAME = ".karios-created.json"
RECORD_PATH = f"/etc/frr/{RECORD_NAME}"
FRRINIT = "/usr/lib/frr/frrinit.sh"
_MARK = "@@karios:"

DISCOVER_SCRIPT = f"""\
echo '{_MARK}hostname'; hostname
echo '{_MARK}links'; ip -j -d addr show
echo '{_MARK}frr_installed'
if [ -x {FRRINIT} ] && command -v vtysh >/dev/null; then echo yes; else echo no; fi
echo '{_MARK}frr_pids'
for d in watchfrr zebra bgpd ospfd bfdd staticd; do
  p=$(cat /run/frr/$d.pid 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$d=$p"
done
for f in {" ".join(MANAGED_FILES)}; do
  echo "{_MARK}file:$f"
  if [ -f "/etc/frr/$f" ]; then base64 -w0 "/etc/frr/$f"; echo; else echo '-'; fi
done
echo '{_MARK}boot_id'; cat /proc/sys/kernel/random/boot_id 2>/dev/null || true
echo '{_MARK}record'
if [ -f {RECORD_PATH} ]; then base64 -w0 {RECORD_PATH}; echo; else echo '-'; fi
echo '{_MARK}end'
"""

# The apply's discovery: the same facts plus, when bgpd runs, one `show bgp l2vpn evpn summary
# json` (one line) and FRR's running configuration (base64, one line: compared with the rendered
# file by :mod:`.running`, a `vtysh` change is not in the file). A node with nothing to change is
# then verified from this very exec: a no-op re-apply costs one SSH exec per node instead of two.
EVPN_SUMMARY_COMMAND = "vtysh -c 'show bgp l2vpn evpn summary json'"
# The post-deploy overlay checks' FRR side (:mod:`.overlay`: VNIs, their import RTs, IMET routes).
OVERLAY_VTYSH = (
    "vtysh -c 'show evpn vni json' -c 'show bgp l2vpn evpn vni json' "
    "-c 'show bgp l2vpn evpn route type multicast json' -c 'show bgp l2vpn evpn summary json'"
)
RUNNING_CONFIG_COMMAND = "vtysh -c 'show running-config'"
_BGPD_ALIVE = 'p=$(cat /run/frr/bgpd.pid 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null'
APPLY_DISCOVER_SCRIPT = DISCOVER_SCRIPT.replace(
    f"echo '{_MARK}end'\n",
    f"echo '{_MARK}evpn'\n"
    f"{_BGPD_ALIVE} && {{ {EVPN_SUMMARY_COMMAND} 2>/dev/null | tr -d '\\n'; echo; }}\n"
    f"echo '{_MARK}overlay'\n"
    f"{_BGPD_ALIVE} && {{ {{ {OVERLAY_VTYSH} 2>/dev/null || true; }} | tr -d '\\n\\t'; echo; }}\n"
    f"echo '{_MARK}running'\n"
    f"{_BGPD_ALIVE} && {{ {RUNNING_CONFIG_COMMAND} 2>/dev/null | base64 -w0; echo; }}\n"
    f"echo '{_MARK}end'\n",
)


@dataclasses.dataclass(frozen=True)
class Interface:
    name: str
    kind: str  # "bridge", "vxlan", "dummy", "veth", "" (physical/unknown)
    mtu: int
    up: bool
    master: str = ""
    ipv4: tuple[str, ...] = ()  # "ip/len"
    vxlan_id: int | None = None
    vxlan_local: str = ""


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    hostname: str
    interfaces: dict[str, Interface]
    frr_installed: bool
    frr_pids: dict[str, int]
    files: dict[str, str | None]  # managed /etc/frr files; None = absent
    boot_id: str = ""  # the kernel's boot id: devices made with `ip link` last one boot
    record: str | None = None  # RECORD_PATH's text (None = absent): see :mod:`.ownership`

    @property
    def frr_running(self) -> bool:
        return "zebra" in self.frr_pids and "bgpd" in self.frr_pids

    @property
    def vtep_ip(self) -> str | None:
        vtep = self.interfaces.get("vtep0")
        if vtep is None or not vtep.ipv4:
            return None
        return vtep.ipv4[0].split("/")[0]

    def vxlan_vnis(self) -> tuple[int, ...]:
        return tuple(sorted(i.vxlan_id for i in self.interfaces.values() if i.kind == "vxlan" and i.vxlan_id))


class FactsParseError(ValueError):
    pass


def _sections(output: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith(_MARK):
            current = line[len(_MARK) :].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    if "end" not in out:
        raise FactsParseError("discovery output is truncated")
    return {k: "\n".join(v) for k, v in out.items()}


def parse_interfaces(ip_json: str) -> dict[str, Interface]:
    """`ip -j -d addr show` → interfaces by name."""
    try:
        raw = json.loads(ip_json or "[]")
    except json.JSONDecodeError as exc:
        raise FactsParseError(f"`ip -j addr` output is not JSON: {exc}") from None
    result = {}
    for link in raw:
        info = link.get("linkinfo") or {}
        data = info.get("info_data") or {}
        kind = info.get("info_kind", "")
        result[link["ifname"]] = Interface(
            name=link["ifname"],
            kind=kind,
            mtu=int(link.get("mtu", 0)),
            up="UP" in (link.get("flags") or []),
            master=link.get("master", ""),
            ipv4=tuple(
                f"{a['local']}/{a['prefixlen']}"
                for a in link.get("addr_info", [])
                if a.get("family") == "inet"
            ),
            vxlan_id=int(data["id"]) if kind == "vxlan" and "id" in data else None,
            vxlan_local=str(data.get("local", "")) if kind == "vxlan" else "",
        )
    return result


def parse_facts(output: str) -> NodeFacts:
    """Parse the output of :data:`DISCOVER_SCRIPT`."""
    sec = _sections(output)
    pids = {}
    for line in sec.get("frr_pids", "").splitlines():
        name, _, pid = line.partition("=")
        if pid.strip().isdigit():
            pids[name.strip()] = int(pid)
    files: dict[str, str | None] = {}
    for name in MANAGED_FILES:
        body = sec.get(f"file:{name}", "-").strip()
        files[name] = None if body == "-" else base64.b64decode(body).decode()
    record = sec.get("record", "-").strip()
    return NodeFacts(
        hostname=sec.get("hostname", "").strip(),
        interfaces=parse_interfaces(sec.get("links", "")),
        frr_installed=sec.get("frr_installed", "").strip() == "yes",
        frr_pids=pids,
        files=files,
        boot_id=sec.get("boot_id", "").strip(),
        record=None if record == "-" else base64.b64decode(record).decode(errors="replace"),
    )


def evpn_summary_of(output: str) -> str | None:
    """The EVPN summary line of :data:`APPLY_DISCOVER_SCRIPT`'s output (None: bgpd was not
    running or the output came from :data:`DISCOVER_SCRIPT`)."""
    line = _sections(output).get("evpn", "").strip()
    return line or None


def overlay_of(output: str) -> str | None:
    """The overlay checks' input from :data:`APPLY_DISCOVER_SCRIPT`'s output: the vtysh JSON
    documents, a tab, the discovery's own ``ip -j -d addr`` JSON (:func:`.overlay.parse_overlay`).
    None: bgpd was not running or the output came from :data:`DISCOVER_SCRIPT`."""
    sec = _sections(output)
    vtysh = sec.get("overlay", "").strip()
    if not vtysh:
        return None
    return vtysh + "\t" + sec.get("links", "").replace("\n", "")


def running_config_of(output: str) -> str | None:
    """FRR's running configuration from :data:`APPLY_DISCOVER_SCRIPT`'s output (None: bgpd was
    not running, vtysh printed nothing, or the output came from :data:`DISCOVER_SCRIPT`)."""
    body = _sections(output).get("running", "").strip()
    try:
        text = base64.b64decode(body, validate=True).decode(errors="replace") if body else ""
    except ValueError:  # not base64: not compared (never a reason to fail the apply)
        return None
    return text if text.strip() else None


@dataclasses.dataclass(frozen=True)
class UnderlayMatch:
    iface: str
    mtu: int
    underlay_ip: str  # "ip/len"
    is_bridge: bool


def find_underlay(facts: NodeFacts, underlay_cidr: str) -> list[UnderlayMatch]:
    """Interfaces holding an IPv4 address inside `underlay_cidr`, bridges first."""
    net = ipaddress.IPv4Network(underlay_cidr, strict=False)
    matches = []
    for iface in facts.interfaces.values():
        for addr in iface.ipv4:
            if ipaddress.IPv4Interface(addr).ip in net:
                matches.append(UnderlayMatch(iface.name, iface.mtu, addr, iface.kind == "bridge"))
    return sorted(matches, key=lambda m: (not m.is_bridge, m.iface))


def facts_to_dict(facts: NodeFacts) -> dict:
    """JSON-able form of `facts` (a baseline kept across a worker restart)."""
    return dataclasses.asdict(facts)


def facts_from_dict(data: dict) -> NodeFacts:
    """Inverse of :func:`facts_to_dict`."""
    interfaces = {
        name: Interface(**{**i, "ipv4": tuple(i.get("ipv4", ()))})
        for name, i in (data.get("interfaces") or {}).items()
    }
    return NodeFacts(
        hostname=data.get("hostname", ""),
        interfaces=interfaces,
        frr_installed=bool(data.get("frr_installed")),
        frr_pids={k: int(v) for k, v in (data.get("frr_pids") or {}).items()},
        files=dict(data.get("files") or {}),
        boot_id=str(data.get("boot_id") or ""),
        record=data.get("record"),
    )
