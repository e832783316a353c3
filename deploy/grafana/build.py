"""Generate the Karios Grafana dashboards (``dashboards/*.json``) from ``panels.py``.

    uv run python deploy/grafana/build.py            # rewrite the JSON files
    uv run python deploy/grafana/build.py --check    # exit 1 when a committed file is stale

Built with grafana-foundation-sdk (see README.md for why). Never edit the JSON by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import quote

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, DataSourceRef, VariableRefresh

sys.path.insert(0, str(Path(__file__).parent))
from panels import DASHBOARDS, Dashboard, Panel

OUT = Path(__file__).parent / "dashboards"
PROM = DataSourceRef(type_val="prometheus", uid="prometheus")
TEMPO_UID = "tempo"


def trace_link(service: str) -> gd.DashboardLink:
    """Tempo search of the service's traces over the panel's time range (Grafana Explore)."""
    left = {
        "datasource": TEMPO_UID,
        "queries": [
            {"refId": "A", "queryType": "traceql", "query": f'{{resource.service.name="{service}"}}'}
        ],
        "range": {"from": "${__from}", "to": "${__to}"},
    }
    url = "/explore?schemaVersion=1&left=" + quote(json.dumps(left, separators=(",", ":")), safe="$_{}")
    return gd.DashboardLink(f"Traces of {service}").type(DashboardLinkType.LINK).url(url).target_blank(True)


def panel(p: Panel, n: int) -> gd.Panel:
    query = prometheus.Dataquery().expr(p.expr).legend_format(p.legend or "__auto").ref_id("A")
    if p.exemplars:
        query = query.exemplar(True)
    b = (stat.Panel() if p.kind == "stat" else timeseries.Panel()).title(p.title).datasource(PROM)
    b = b.with_target(query).unit(p.unit).height(6 if p.kind == "stat" else 8)
    b = b.span(6 if p.kind == "stat" else p.width).id(n)
    if p.description:
        b = b.description(p.description)
    if p.trace:
        b = b.data_links([trace_link(p.trace)])
    return b


def build(d: Dashboard) -> dict:
    b = (
        gd.Dashboard(d.title)
        .uid(d.uid)
        .description(d.description)
        .tags(["karios"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .editable()
    )
    for name, query in d.variables.items():
        b = b.with_variable(
            gd.QueryVariable(name)
            .label(name)
            .datasource(PROM)
            .query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True)
            .all_value(".*")
            .multi(True)
        )
    for n, p in enumerate(d.panels, 1):
        b = b.with_panel(panel(p, n))
    b = b.link(
        gd.DashboardLink("Karios").type(DashboardLinkType.DASHBOARDS).tags(["karios"]).as_dropdown(True)
    )
    return json.loads(json.dumps(b.build(), cls=JSONEncoder))


def render(d: Dashboard) -> str:
    return json.dumps(build(d), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for d in DASHBOARDS:
        path = OUT / f"{d.uid}.json"
        text = render(d)
        if "--check" in argv:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale dashboards (run deploy/grafana/build.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
