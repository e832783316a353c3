"""Input limits declared once (``karios.common.limits``) and matching the database columns.

The column check walks the SQLModel tables of every service: a request or contract field
with the name of a column must refuse what the column cannot hold (a longer string, an
integer outside int4, NUL bytes, lone surrogates) — by validation, so it is a 422, not a 500.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

import pytest
import sqlalchemy as sa
from pydantic import BaseModel, TypeAdapter, ValidationError
from sqlmodel import SQLModel

import karios.api_gateway.models
import karios.api_gateway.readmodel
import karios.fabric_worker.models
import karios.inventory.models
import karios.provisioner.models  # noqa: F401  (registers the tables)
from karios.api_gateway.models import (
    BmcIpBody,
    CompleteBody,
    FirstbootBody,
    JobPatch,
    ProvisionRequest,
    StepBody,
    UnprovisionBody,
)
from karios.api_gateway.routes.nodes import AdoptRequest
from karios.api_gateway.routes.register import RegisterRequest
from karios.common.contracts.inventory import RegisterNode
from karios.common.contracts.nodes import AdoptNode, RegisterComputeNode
from karios.common.limits import INT32_MAX, BoundedIP, Int32Id, OptBoundedIP, SafeText, Text, check_text

#: Every model a caller fills in and a service stores (the gateway's request bodies, the
#: inventory's register command).
REQUEST_MODELS: list[type[BaseModel]] = [
    RegisterRequest,
    RegisterNode,
    AdoptRequest,
    AdoptNode,
    RegisterComputeNode,
    ProvisionRequest,
    BmcIpBody,
    StepBody,
    CompleteBody,
    FirstbootBody,
    UnprovisionBody,
    JobPatch,
]


def _columns() -> dict[str, list[sa.Column]]:
    by_name: dict[str, list[sa.Column]] = {}
    for table in SQLModel.metadata.tables.values():
        for col in table.columns:
            by_name.setdefault(col.name.lower(), []).append(col)
    return by_name


def _adapter(model: type[BaseModel], name: str) -> TypeAdapter[Any]:
    field = model.model_fields[name]
    return TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)


def _is_text(model: type[BaseModel], name: str) -> bool:
    ann = model.model_fields[name].annotation
    args = get_args(ann) if get_origin(ann) is not None else (ann,)
    return (
        str in args
        or any(get_args(a)[:1] == (str,) for a in args if get_origin(a) is Annotated)
        or (ann is str)
    )


def _refuses(adapter: TypeAdapter[Any], value: Any) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return True
    return False


def test_the_tables_of_every_service_are_walked():
    schemas = {t.schema for t in SQLModel.metadata.tables.values()}
    assert {"gateway", "inventory", "provision", "fabric"} <= schemas, schemas


@pytest.mark.parametrize("model", REQUEST_MODELS, ids=lambda m: m.__name__)
def test_fields_refuse_what_their_columns_cannot_hold(model):
    columns = _columns()
    problems: list[str] = []
    for name in model.model_fields:
        adapter = _adapter(model, name)
        for col in columns.get(name.lower(), []):
            where = f"{model.__name__}.{name} vs {col.table.fullname}.{col.name}"
            length = getattr(col.type, "length", None)
            # digits: a value valid for most rules, so only the length can refuse it
            if isinstance(length, int) and not _refuses(adapter, "1" * (length + 1)):
                problems.append(f"{where}: accepts {length + 1} characters, column is varchar({length})")
            int4 = isinstance(col.type, sa.Integer) and not isinstance(col.type, sa.BigInteger)
            if int4 and not _refuses(adapter, INT32_MAX + 1):
                problems.append(f"{where}: accepts {INT32_MAX + 1}, column is int4")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("model", REQUEST_MODELS, ids=lambda m: m.__name__)
def test_every_text_field_refuses_nul_and_lone_surrogates(model):
    problems = []
    for name in model.model_fields:
        if not _is_text(model, name):
            continue
        adapter = _adapter(model, name)
        for bad in ("1\x00", "1\ud800"):
            if not _refuses(adapter, bad):
                problems.append(f"{model.__name__}.{name} accepts {bad!r}")
    assert not problems, "\n".join(problems)


def test_the_walk_finds_the_known_columns():
    """The name match is what the two tests above rely on: it must see these pairs."""
    columns = _columns()
    assert any(c.table.name == "bmc_infos" for c in columns["bmc_ip"])
    assert any(isinstance(c.type, sa.Integer) for c in columns["atlas_device_id"])
    assert any(getattr(c.type, "length", None) == 64 for c in columns["parent_id"])
    assert "os_hostname" in RegisterRequest.model_fields and "os_hostname" in columns


@pytest.mark.parametrize("bad", ["a\x00b", "\x00", "x\ud800", "\udfff"])
def test_check_text_refuses(bad):
    with pytest.raises(ValueError, match=r"NUL|surrogate"):
        check_text(bad)


@pytest.mark.parametrize("good", ["", "mgmt-01", "Grüße 🚀", "tab\tand\nnewline"])
def test_check_text_keeps_ordinary_text(good):
    assert check_text(good) == good


def test_shared_types():
    assert TypeAdapter(BoundedIP).validate_python(" fe80::1%eth0 ") == "fe80::1%eth0"
    assert _refuses(TypeAdapter(BoundedIP), "fe80::1%" + "e" * 80)
    assert _refuses(TypeAdapter(BoundedIP), "not-an-ip")
    assert TypeAdapter(OptBoundedIP).validate_python("") is None
    assert TypeAdapter(OptBoundedIP).validate_python(None) is None
    assert _refuses(TypeAdapter(OptBoundedIP), "1" * 65)
    assert TypeAdapter(Int32Id).validate_python(INT32_MAX) == INT32_MAX
    assert _refuses(TypeAdapter(Int32Id), INT32_MAX + 1) and _refuses(TypeAdapter(Int32Id), -1)
    assert _refuses(TypeAdapter(Text), "t" * 4097)
    assert TypeAdapter(SafeText).validate_python("t" * 100_000)  # length is the field's to give
    assert _refuses(TypeAdapter(SafeText), "t\x00")
