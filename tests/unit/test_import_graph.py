"""The import graph of ``karios`` has no circles, and services stay apart.

The graph (grimp) covers every module of the namespace package — libs/common, services/*/src,
cli/src — and counts every import: those under ``if TYPE_CHECKING:`` and those inside a function
too (a circle hidden from the interpreter is still one a reader has to untangle). A circle is
reported as its strongly connected component: the modules, and which of them imports which.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "libs/common/src", ROOT / "cli/src", *sorted(ROOT.glob("services/*/src"))]
NOT_MODULES = "migrations"  # Alembic's env.py and versions/ are scripts loaded by path


@functools.cache
def karios_graph() -> grimp.ImportGraph:
    # cache_dir=None: no cache directory written into the tree.
    return grimp.build_graph("karios", cache_dir=None, exclude_type_checking_imports=False)


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each strongly connected component of more than one module, sorted."""
    seen: set[str] = set()
    found: list[list[str]] = []
    for module in sorted(graph.modules):
        if module in seen:
            continue
        # What `module` reaches and what reaches it: together, the modules on a circle with it.
        component = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if component:
            component.add(module)
            seen |= component
            found.append(sorted(component))
    return found


def describe_cycle(graph: grimp.ImportGraph, component: list[str]) -> str:
    lines = ["  " + ", ".join(component)]
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & set(component)):
            line = graph.get_import_details(importer=importer, imported=imported)[0]["line_number"]
            lines.append(f"    {importer} -> {imported} (line {line})")
    return "\n".join(lines)


def modules_on_disk() -> set[str]:
    found: set[str] = set()
    for src in SOURCES:
        for path in (src / "karios").rglob("*.py"):
            parts = path.relative_to(src).with_suffix("").parts
            if NOT_MODULES in parts:
                continue
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_the_graph_covers_every_module() -> None:
    """Guards the two tests below: grimp skips a directory without ``__init__.py``, and an
    out-of-date environment would hand it another checkout's sources."""
    graph = karios_graph()
    missing = sorted(modules_on_disk() - graph.modules)
    assert not missing, (
        "modules the import graph does not see (a package directory without __init__.py, or "
        "run `uv sync --all-packages`):\n  " + "\n  ".join(missing)
    )


def test_no_import_cycles() -> None:
    graph = karios_graph()
    cycles = import_cycles(graph)
    assert not cycles, (
        f"{len(cycles)} import circle(s) (strongly connected components; TYPE_CHECKING and "
        "function-local imports count):\n" + "\n".join(describe_cycle(graph, c) for c in cycles)
    )


def test_services_never_import_each_other() -> None:
    """A service imports only ``karios.common`` and itself; ``karios.common`` imports neither a
    service nor the cli (docs/DEVELOPING.md, "The tree")."""
    graph = karios_graph()
    tops = {m.split(".")[1] for m in graph.modules if m.count(".") >= 1}
    services = tops - {"common", "cli"}
    assert {"api_gateway", "fabric_worker", "provisioner"} <= services  # the graph is the real one
    wrong: list[str] = []
    for importer in sorted(graph.modules):
        own = importer.split(".")[1] if importer.count(".") >= 1 else None
        if own == "cli" or own is None:
            continue
        allowed = {"common"} if own == "common" else {"common", own}
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported.count(".") >= 1 and imported.split(".")[1] not in allowed:
                line = graph.get_import_details(importer=importer, imported=imported)[0]["line_number"]
                wrong.append(f"{importer} -> {imported} (line {line})")
    assert not wrong, "imports across the boundaries:\n  " + "\n  ".join(wrong)


def test_the_check_reads_every_form_of_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A circle closed only by a relative import, ``import a.b.c``, a TYPE_CHECKING import and a
    function-local import is still found; modules off the circle are not reported."""
    pkg = tmp_path / "graphprobe"
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "import graphprobe.sub.c\n",
        "sub/__init__.py": "",
        "sub/c.py": """
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from ..d import thing
        """,
        "d.py": """
            def thing():
                from .a import b

                return b
        """,
        "e.py": "from .sub.c import TYPE_CHECKING\nimport graphprobe.a\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("graphprobe", cache_dir=None, exclude_type_checking_imports=False)
    cycle = ["graphprobe.a", "graphprobe.b", "graphprobe.d", "graphprobe.sub.c"]
    assert import_cycles(graph) == [cycle]
    assert "graphprobe.d -> graphprobe.a (line 2)" in describe_cycle(graph, cycle)
