"""Fixtures of the library's unit tests."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from karios.common import telemetry_tracing


@pytest.fixture
def spans():
    telemetry_tracing.setup_tracing("unit")
    exporter = InMemorySpanExporter()
    assert telemetry_tracing._tracer_provider is not None
    telemetry_tracing._tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()
