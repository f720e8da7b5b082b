"""Empty MLflow stores (SQLite files), ready at once for a test to export into.

MLflow builds a new store's schema with its migrations the first time a store is used: 5-20 s on a loaded 2-core
machine, for every store a test makes. The store is MLflow's own business, not what orch's tests test, so one
empty store is migrated per test process, by MLflow itself, and each test's store begins as a copy of it: the same
file MLflow would have made there.

    uri = empty_store(project.path / ".orch" / "mlflow.db")   # "sqlite:///…/mlflow.db"
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_made: list[Path] = []  # the process's migrated empty store, once made


def _template() -> Path:
    if not _made:
        from mlflow import MlflowClient

        folder = Path(tempfile.mkdtemp(prefix="orch-mlflow-store-"))
        atexit.register(shutil.rmtree, folder, True)
        MlflowClient(f"sqlite:///{folder / 'empty.db'}").search_experiments()  # MLflow creates and migrates it
        _made.append(folder / "empty.db")
    return _made[0]


def empty_store(path: Path) -> str:
    """``path`` an empty MLflow store, as MLflow makes one at its first use; its tracking URI."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template(), path)
    return f"sqlite:///{path}"
