"""Which process answered: every service's ``/readyz`` carries its instance id, so a supervisor
(``karios up``) counts a service as ready only when the child it started answers — never a
foreign process that happens to hold the port (issue 24, S3)."""

from __future__ import annotations

import os
import uuid
from functools import cache

INSTANCE_HEADER = "X-Karios-Instance"
INSTANCE_ENV = "KARIOS_INSTANCE_ID"


@cache
def instance_id() -> str:
    """The id a supervisor gave this process (``KARIOS_INSTANCE_ID``), else a random one."""
    return os.environ.get(INSTANCE_ENV) or uuid.uuid4().hex
