"""docs/bootapi.md lists every embedded catalog entry with the platform slugs it accepts, generated
from the catalog (``core.catalog_table``). ``UPDATE_GOLDEN=1`` rewrites the section."""

from __future__ import annotations

from pathlib import Path

from karios.bootapi import core
from karios.common.oscatalog import default_set_dir, load_template_set
from tests.fixtures.golden import updating

DOC = Path(__file__).resolve().parents[3] / "docs" / "bootapi.md"
BEGIN, END = "<!-- catalog-table:begin -->\n", "<!-- catalog-table:end -->"


def test_the_documented_catalog_table_matches_the_embedded_catalog():
    table = core.catalog_table(load_template_set(default_set_dir()).catalog.entries)
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    assert rest, f"{DOC.name} has no {BEGIN.strip()} marker"
    if updating():
        DOC.write_text(head + BEGIN + table + END + tail)
        text = DOC.read_text()
    assert BEGIN + table + END in text, f"{DOC.name} is stale; the table should be:\n{table}"
    for slug in ("debian-13", "debian-trixie", "almalinux-9", "fedora-42"):
        assert f"`{slug}`" in table
