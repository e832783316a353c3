"""The bus: subjects, streams, envelope, broker factory, consumer helpers."""
