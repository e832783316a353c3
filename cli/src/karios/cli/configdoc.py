"""docs/configuration.md, generated from every settings class (``karios config-doc``)."""

from __future__ import annotations

import importlib
import json
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

SETTINGS_CLASSES = (
    ("Shared by every service", "karios.common.settings", "KariosSettings"),
    ("inventory", "karios.inventory.settings", "InventorySettings"),
    ("provisioner", "karios.provisioner.config", "ProvisionerConfig"),
    ("fabric-worker (rollout)", "karios.fabric_worker.settings", "FabricWorkerSettings"),
    ("bootapi (the seed's names)", "karios.bootapi.settings", "BootapiSettings"),
)


def _default(name: str, field: FieldInfo) -> str:
    if field.default is not PydanticUndefined:
        value: Any = field.default
    elif field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if not isinstance(value, dict | list):
            return "(computed at start; see meaning)"
    else:
        return "(required)"
    if hasattr(value, "get_secret_value") or (value and ("password" in name or name.endswith("token"))):
        return "(secret)"
    if isinstance(value, dict | list):
        return f"`{json.dumps(value)}`"
    return f"`{value}`" if value not in (None, "") else "unset"


def render() -> str:
    out = [
        "# Configuration",
        "",
        "Generated from the settings classes by `uv run karios config-doc > docs/configuration.md`;",
        "a test fails when it is stale. Every setting is an environment variable.",
        "",
    ]
    for title, module, cls_name in SETTINGS_CLASSES:
        cls = getattr(importlib.import_module(module), cls_name)
        prefix = cls.model_config.get("env_prefix", "")
        out += [f"## {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        for name, field in cls.model_fields.items():
            env = f"{prefix}{name}".upper()
            alias = field.validation_alias
            if alias is not None and hasattr(alias, "choices"):
                # pydantic-settings reads an alias as the whole variable name (no prefix added).
                env = " / ".join(str(c).upper() for c in alias.choices)
            desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{env}` | {_default(name, field)} | {desc} |")
        out.append("")
    return "\n".join(out)
