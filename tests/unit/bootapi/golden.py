"""Golden-file comparison; ``UPDATE_GOLDEN=1`` rewrites the files (review the diff!)."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{name} differs from its golden file (UPDATE_GOLDEN=1 to accept)"
