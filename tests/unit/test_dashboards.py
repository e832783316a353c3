"""The dashboards are generated (committed JSON == a fresh build), query only metrics the code
defines, link traces to Tempo; every alert rule has a runbook paragraph and promtool cases that
fire and that do not. The queries against a real Prometheus:
tests/integration/test_prometheus_dashboards.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy" / "grafana"))
from build import OUT, build, main, render  # noqa: E402
from panels import DASHBOARDS  # noqa: E402

RULES = yaml.safe_load((ROOT / "deploy/prometheus/rules/karios.rules.yml").read_text())
RULE_TESTS = yaml.safe_load((ROOT / "deploy/prometheus/tests/karios.test.yml").read_text())
ALERTS = [r for g in RULES["groups"] for r in g["rules"] if "alert" in r]
METRIC = re.compile(r"\b((?:karios|bootapi)_[a-z0-9_]+)")
SOURCES = "\n".join(p.read_text() for base in ("services", "libs") for p in (ROOT / base).rglob("*.py"))


def test_committed_dashboards_equal_a_fresh_generation() -> None:
    assert main(["--check"]) == 0, "run: uv run python deploy/grafana/build.py"
    assert sorted(p.name for p in OUT.glob("*.json")) == sorted(f"{d.uid}.json" for d in DASHBOARDS)
    for d in DASHBOARDS:
        assert (OUT / f"{d.uid}.json").read_text() == render(d)


def test_the_four_dashboards_and_their_panels() -> None:
    assert [d.uid for d in DASHBOARDS] == [
        "karios-overview",
        "karios-provisioning",
        "karios-fabric",
        "karios-bootapi",
    ]
    for d in DASHBOARDS:
        built = build(d)
        titles = [p["title"] for p in built["panels"]]
        assert len(titles) == len(set(titles)) >= 6, d.uid
        for p in built["panels"]:
            assert p["datasource"] == {"type": "prometheus", "uid": "prometheus"}
            assert [t["refId"] for t in p["targets"]] == ["A"] and p["targets"][0]["expr"], p["title"]


def _base(name: str) -> str:
    return re.sub(r"_(bucket|sum|count|total)$", "", name)


def test_every_queried_metric_is_defined_in_the_code() -> None:
    names = {m for d in DASHBOARDS for p in d.panels for m in METRIC.findall(p.expr)}
    names |= {m for r in ALERTS for m in METRIC.findall(r["expr"])}
    assert len(names) > 25
    missing = sorted(n for n in names if f'"{_base(n)}' not in SOURCES and f'"{n}"' not in SOURCES)
    assert not missing, f"queried but defined nowhere: {missing}"


def test_trace_links_search_tempo_by_service() -> None:
    links = [
        (p["title"], link["url"])
        for d in DASHBOARDS
        for p in build(d)["panels"]
        for link in p["fieldConfig"]["defaults"].get("links") or []
    ]
    assert len(links) >= 8
    for title, url in links:
        assert url.startswith("/explore?") and "tempo" in url and "service.name" in url, title


def test_variables_are_label_values_queries() -> None:
    for d in DASHBOARDS:
        for v in build(d)["templating"].get("list", []):
            assert v["query"].startswith("label_values(") and v["includeAll"] and v["allValue"] == ".*"
            assert any(f"${v['name']}" in p.expr for p in d.panels), v["name"]


@pytest.mark.parametrize("rule", ALERTS, ids=lambda r: r["alert"])
def test_every_alert_has_a_runbook_and_firing_and_quiet_cases(rule: dict) -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    url = rule["annotations"]["runbook_url"]
    assert url == f"docs/runbooks.md#{rule['alert'].lower()}"
    assert re.search(rf"^## {rule['alert']}\b", runbooks, re.M), f"no runbook section for {rule['alert']}"
    cases = [c for t in RULE_TESTS["tests"] for c in t["alert_rule_test"] if c["alertname"] == rule["alert"]]
    assert any(c["exp_alerts"] for c in cases), "no firing case"
    assert any(not c["exp_alerts"] for c in cases), "no not-firing case"
    assert rule["labels"]["severity"] in ("warning", "critical")
