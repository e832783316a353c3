"""What the image build's modules share (``__init__`` and ``zfs``): the package's templates and a
subprocess run whose failure names the tool and the end of its stderr."""

from __future__ import annotations

import subprocess

from karios.common.errors import PermanentFailure
from karios.provisioner.templating import package_templates

TEMPLATES = package_templates("karios.provisioner.install.live")


def run(argv: list[str], timeout: float = 300, **kw) -> str:  # type: ignore[no-untyped-def]
    """Run ``argv``; its stdout, or :class:`PermanentFailure` when it exits non-zero."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if res.returncode != 0:
        raise PermanentFailure(f"{argv[0]} failed ({res.returncode}): {res.stderr.strip()[-800:]}")
    return res.stdout
