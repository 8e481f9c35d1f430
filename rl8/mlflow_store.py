"""A local MLflow store that the installed MLflow cannot open because a newer MLflow wrote it:
MLflow's own error asks to upgrade the store (``mlflow db upgrade``), which is already newer than
the client. Tracking (a run, ``rl8 runs``) and io (a policy by run id) check it where MLflow
failed to open a store, and say what to install instead."""

from __future__ import annotations

import contextlib
import importlib.util
import sqlite3
from pathlib import Path

__all__ = ["StoreSchemaError", "check_store_schema", "sqlite_file"]


class StoreSchemaError(RuntimeError):
    """A SQLite MLflow store has a schema that a newer MLflow than the installed one wrote; the
    installed MLflow cannot open it, and nothing downgrades it. The message names the store, the
    installed MLflow and what to install."""


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; ``None`` for other stores and ``:memory:``."""
    if not uri.lower().startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def _store_revision(db: Path) -> str | None:
    """The schema revision (alembic's) recorded in the SQLite file ``db``, opened read-only;
    ``None`` when there is no such file, table or row."""
    if not db.is_file():
        return None
    try:
        with contextlib.closing(
            sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True, timeout=5)
        ) as connection:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:  # not a database, or one without alembic's table: MLflow says what it is
        return None
    return row[0] if row else None


def _known_revisions() -> set[str] | None:
    """The schema revisions of the installed MLflow's migrations (its ``store/db_migrations``
    folder, read with alembic); ``None`` where that folder is not found."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "store" / "db_migrations"
    if not (folder / "versions").is_dir():
        return None
    from alembic.script import ScriptDirectory

    return {script.revision for script in ScriptDirectory(str(folder)).walk_revisions()}


def check_store_schema(uri: str) -> None:
    """Raise :class:`StoreSchemaError` when ``uri`` is a ``sqlite:///`` store whose schema
    revision is not one of the installed MLflow's migrations (a newer MLflow wrote it). Other
    stores, a missing file and a known revision pass: for a store older than the installed
    MLflow, MLflow's advice (``mlflow db upgrade``) is right.

    Args:
        uri: The tracking URI of the store.
    """
    db = sqlite_file(uri)
    revision = None if db is None else _store_revision(db)
    if revision is None:
        return
    known = _known_revisions()
    if known is None or revision in known:
        return
    from mlflow.version import VERSION

    raise StoreSchemaError(
        f"the MLflow store {uri} was written by a newer MLflow than the installed MLflow {VERSION} "
        f"(its schema revision {revision!r} is unknown to {VERSION}), which cannot open it: "
        "'mlflow db upgrade' does not apply, nothing downgrades a store. Install the MLflow that "
        'wrote it, or a newer one: from an up-to-date rl8 clone python -m pip install -e ".[ui]" '
        '(mlflow and mlflow-skinny of one release), or python -m pip install "mlflow==X.Y.Z" '
        '"mlflow-skinny==X.Y.Z"; or give another store (--tracking-uri sqlite:///PATH/mlflow.db)'
    ) from None  # where MLflow's error is being handled: its advice is the opposite
