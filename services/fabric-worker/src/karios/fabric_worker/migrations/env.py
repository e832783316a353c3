from sqlmodel import SQLModel

import karios.fabric_worker.models  # noqa: F401  (registers the tables)
from karios.common.db.migrate import run_env

run_env(SQLModel.metadata)
