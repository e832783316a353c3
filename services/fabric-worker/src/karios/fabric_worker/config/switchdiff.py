"""The change between two rendered switch configurations, as an operator pastes it (pure).

Both texts come from :func:`render.render_switch_config`; the result holds the lines to remove
and the lines to add, in the syntax of the NOS, ready to paste on the running switch:

- **FRR** (``other``, the FRR half of ``sonic``), **EOS**, **NX-OS**: the text is a tree by
  indentation (``router bgp N`` > ``address-family …`` > lines; ``interface X`` > lines). A block
  both texts hold is entered and changed line by line (``no <line>`` / ``<line>``) and left again
  (``exit``, ``exit-address-family``); a block only the new text holds is pasted whole; a block
  only the old text holds is removed with ``no <header>`` (``no router bgp 65000``, ``no router
  ospf``, ``no key chain …``) — except an interface (and an FRR ``address-family``), which
  cannot be deleted: its lines are negated one by one. Within a block removals come first (a
  ``remote-as`` or listen range is removed before its replacement is set); at the top level
  new and changed blocks come first and removed ones follow in reverse order (``no router
  bgp`` before ``no feature bgp``, the users of a key chain before the key chain), except a
  block replaced by one of its kind, removed first (``no router bgp 65000`` before ``router
  bgp 65100``: a switch runs one BGP instance).
- **Cumulus NVUE**: ``nv unset`` for every setting that is gone (a value replaced by another
  value of the same setting is just set again), ``nv set`` for every new one, ``nv config apply``.
- **SONiC**: a JSON Patch (RFC 6902, ``sudo config apply-patch``) of the CONFIG_DB part, then
  the FRR part as above.

Comment lines (``!`` / ``#``: names, hints, placeholders for the operator) are not
configuration and are ignored; so are FRR's/EOS's ``end`` and the closing ``exit`` lines (the
tree carries them). Secrets are placeholders: a removed secret line is negated without its
value (``no neighbor PG password``), an added one shows the placeholder the operator replaces.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

DIALECT = {"other": "frr", "frr": "frr", "sonic": "frr", "eos": "eos", "nxos": "nxos", "cumulus": "nvue"}
_COMMENT = {
    "other": ("!",),
    "frr": ("!",),
    "eos": ("!",),
    "nxos": ("!",),
    "cumulus": ("#",),
    "sonic": ("!", "#"),
}
_SKIP = {"end", "exit", "exit-address-family"}
_NVUE_APPLY = "nv config apply -y"
# Tokens between a setting and its secret placeholder (`md5 0 <key>`, `password 0 <key>`).
_SECRET_PREFIX = {"0", "7", "md5", "sha256"}
# NVUE settings whose next token is the key of a collection entry (unset the entry, not a leaf).
_NVUE_COLLECTIONS = {"address", "listen-range", "network"}


def config_lines(nos: str, text: str) -> list[str]:
    """The configuration lines of `text` (raw, indentation kept): no comment, blank or `end`."""
    marks = _COMMENT[nos]
    return [
        line.rstrip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith(marks) and line.strip() != "end"
    ]


def change(nos: str, before: str, after: str) -> str:
    """What to paste on a switch running `before` so that it runs `after` ("" = nothing)."""
    old, new = config_lines(nos, before), config_lines(nos, after)
    if old == new:
        return ""
    if nos == "cumulus":
        return _nvue(old, new)
    if nos == "sonic":
        return _sonic(old, new)
    return _join(_tree_diff(_parse(old), _parse(new), DIALECT[nos], top=True))


def _join(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


# -- indentation trees (FRR, EOS, NX-OS) -------------------------------------------------------
@dataclass
class _Node:
    indent: str
    line: str
    children: list[_Node] = field(default_factory=list)


def _parse(lines: list[str]) -> list[_Node]:
    root: list[_Node] = []
    stack: list[tuple[int, _Node]] = []
    for raw in lines:
        text = raw.strip()
        if text in _SKIP:
            continue
        depth = len(raw) - len(raw.lstrip())
        node = _Node(raw[:depth], text)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        (stack[-1][1].children if stack else root).append(node)
        stack.append((depth, node))
    return root


def _exit(node: _Node, dialect: str) -> str:
    if dialect == "frr" and node.line.startswith("address-family"):
        return f"{node.indent}exit-address-family"
    return f"{node.indent}exit"


# Where a dialect's `no` form is not `no <line>`: FRR's `no neighbor PG bfd profile P` removes
# the profile only and leaves BFD on (FRR 8.4, seen in the lab); `no neighbor PG bfd` removes both.
_NO = {"frr": ((re.compile(r"^(neighbor \S+ bfd) profile \S+$"), r"no \1"),)}


def negate(line: str, dialect: str = "frr") -> str:
    """The `no` form of one configuration line (FRR, EOS and NX-OS agree but for `_NO`)."""
    for pattern, repl in _NO.get(dialect, ()):
        if pattern.match(line):
            return pattern.sub(repl, line)
    if line.startswith("no "):
        return line[3:]
    tokens = line.split()
    secret = next((i for i, t in enumerate(tokens) if t.startswith("<") and t.endswith(">")), None)
    if secret is not None:
        while secret > 1 and tokens[secret - 1] in _SECRET_PREFIX:
            secret -= 1
        tokens = tokens[:secret]
    return "no " + " ".join(tokens)


def _whole(node: _Node, dialect: str) -> list[str]:
    out = [node.indent + node.line]
    if node.children:
        for child in node.children:
            out += _whole(child, dialect)
        out.append(_exit(node, dialect))
    return out


def _unset_each(node: _Node, dialect: str) -> list[str]:
    """Negate every line of a block that cannot itself be deleted."""
    out = [node.indent + node.line]
    for child in reversed(node.children):
        out += _remove(child, dialect) if child.children else [child.indent + negate(child.line, dialect)]
    return [*out, _exit(node, dialect)]


def _remove(node: _Node, dialect: str) -> list[str]:
    if not node.children:
        return [node.indent + negate(node.line, dialect)]
    name = node.line.split()
    keep = name[0] == "interface" and not (dialect != "frr" and name[1].lower().startswith("loopback"))
    if keep or (dialect == "frr" and name[0] == "address-family"):
        return _unset_each(node, dialect)
    return [node.indent + negate(node.line, dialect)]


def _tree_diff(old: list[_Node], new: list[_Node], dialect: str, *, top: bool = False) -> list[str]:
    was = {n.line: n for n in old}
    now = {n.line: n for n in new}
    gone = [n for n in old if n.line not in now]
    # A block replaced by one of the same kind (`router bgp 65000` -> `router bgp 65100`: one BGP
    # instance per switch) goes first; at the top level any other removal goes last.
    kinds = {_kind(n) for n in new if n.line not in was and n.children}
    first = [n for n in gone if not top or (n.children and _kind(n) in kinds)]
    removals = [line for n in reversed(gone) if n not in first for line in _remove(n, dialect)]
    out = [line for n in reversed(first) for line in _remove(n, dialect)]
    for node in new:
        prev = was.get(node.line)
        if prev is None:
            if node.children or node.indent + node.line not in out:  # `no x` both removed and added
                out += _whole(node, dialect)
        elif node.children or prev.children:
            inner = _tree_diff(prev.children, node.children, dialect)
            if inner:
                out += [node.indent + node.line, *inner, _exit(node, dialect)]
    return out + removals


def _kind(node: _Node) -> tuple[str, ...]:
    return tuple(node.line.split()[:-1])


# -- Cumulus NVUE --------------------------------------------------------------------------
def _nvue(old: list[str], new: list[str]) -> str:
    old_set = [line for line in old if line != _NVUE_APPLY]
    new_set = [line for line in new if line != _NVUE_APPLY]
    added = [line for line in new_set if line not in old_set]
    replaced = {tuple(line.split()[:-1]) for line in added}
    unsets = []
    for line in reversed(old_set):
        if line in new_set or not line.startswith("nv set "):
            continue
        tokens = line.split()
        key = next((i for i, t in enumerate(tokens[:-1]) if t in _NVUE_COLLECTIONS), None)
        if tuple(tokens[:-1]) in replaced and key != len(tokens) - 2:
            continue  # the same setting gets another value below (an entry's key is no value)
        path = tokens[2 : key + 2] if key is not None else tokens[2:-1]
        unsets.append(" ".join(["nv", "unset", *path]))
    return _join([*unsets, *added, _NVUE_APPLY])


# -- SONiC: CONFIG_DB patch + FRR ------------------------------------------------------------
def _split_sonic(lines: list[str]) -> tuple[dict, list[str]]:
    """The CONFIG_DB object (the lines from `{` to the first `}` at column 0) and the FRR lines."""
    if not lines or lines[0] != "{":
        return {}, lines
    end = lines.index("}")
    return json.loads("\n".join(lines[: end + 1])), lines[end + 1 :]


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def json_patch(old: dict, new: dict, *path: str) -> list[dict]:
    """RFC 6902 operations turning `old` into `new` (removals first, then additions)."""
    removes: list[dict] = []
    adds: list[dict] = []
    for key in old:
        if key not in new:
            removes.append({"op": "remove", "path": _pointer(*path, key)})
    for key, value in new.items():
        if key not in old:
            adds.append({"op": "add", "path": _pointer(*path, key), "value": value})
        elif isinstance(value, dict) and isinstance(old[key], dict):
            sub = json_patch(old[key], value, *path, key)
            removes += [op for op in sub if op["op"] == "remove"]
            adds += [op for op in sub if op["op"] != "remove"]
        elif value != old[key]:
            adds.append({"op": "replace", "path": _pointer(*path, key), "value": value})
    return removes + adds


def _sonic(old: list[str], new: list[str]) -> str:
    old_db, old_frr = _split_sonic(old)
    new_db, new_frr = _split_sonic(new)
    frr = _tree_diff(_parse(old_frr), _parse(new_frr), "frr", top=True)
    patch = json_patch(old_db, new_db)
    if not patch:
        return _join(frr)
    out = [
        "# 1) CONFIG_DB: save as karios-fabric-patch.json, then:",
        "#    sudo config apply-patch karios-fabric-patch.json",
        json.dumps(patch, indent=4),
    ]
    if frr:
        out += ["# 2) FRR: paste in vtysh (configure terminal), then: vtysh -c 'write memory'", *frr]
    return _join(out)
