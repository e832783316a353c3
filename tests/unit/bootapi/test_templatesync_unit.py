"""Template store and sync pieces that need no git server."""

from __future__ import annotations

from karios.bootapi.metrics import BootapiMetrics
from karios.bootapi.templatesync import GitTemplateSync, TemplateStore, redact_url
from karios.common.oscatalog import default_set_dir, load_template_set


def test_credentials_in_git_urls_are_masked():
    assert (
        redact_url("https://bot:ghp_s3cret@git.example/templates.git")
        == "https://***@git.example/templates.git"
    )
    assert (
        redact_url("fatal: could not read from https://u:p@h/x")
        == "fatal: could not read from https://***@h/x"
    )
    assert redact_url("file:///srv/templates.git") == "file:///srv/templates.git"


def test_a_failed_sync_keeps_the_served_set_and_counts(tmp_path):
    metrics = BootapiMetrics()
    store = TemplateStore(metrics)
    good = load_template_set(default_set_dir())
    store.publish(good)
    sync = GitTemplateSync(
        f"https://user:pw@127.0.0.1:9/{tmp_path.name}.git", store, workdir=tmp_path, timeout=10
    )
    assert sync.sync_once() is False
    assert store.current is good and store.generation == 1
    assert metrics.registry.get_sample_value("bootapi_template_sync_failures_total") == 1
    assert "pw" not in store.last_error
