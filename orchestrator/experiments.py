"""The experiment registry: one SQLite file per project, ``.orch/experiments.db``.

The only module that imports sqlite3. The schema is versioned with ``PRAGMA user_version`` and
upgraded by the ordered ``MIGRATIONS``; WAL mode and a busy timeout let two orch processes (two
deploys racing) write without corrupting anything.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .errors import NotFoundError, OrchError
from .launch_guard import LaunchGuard, forget, launcher_alive

STATUSES = ("launching", "running", "finished", "crashed", "stopped", "failed", "lost")
# a run that ran and is over; "lost" (its container restarted under it) can still resume: see status.sync
ENDED = ("finished", "crashed", "stopped", "lost")
FINAL = (*ENDED, "failed")  # an experiment whose record will not change again

MIGRATIONS: list[str] = [
    """
    CREATE TABLE experiments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        project TEXT NOT NULL,
        message TEXT,
        created REAL NOT NULL,
        started REAL,
        ended REAL,
        target TEXT NOT NULL,
        target_info TEXT NOT NULL DEFAULT '{}',
        revision TEXT NOT NULL,
        revision_files TEXT NOT NULL DEFAULT '[]',
        git_commit TEXT,
        git_dirty INTEGER,
        git_diff TEXT,
        command TEXT NOT NULL,
        config TEXT NOT NULL DEFAULT '{}',
        batching TEXT NOT NULL DEFAULT '{}',
        batching_plan TEXT,
        parent INTEGER REFERENCES experiments(id),
        checkpoints TEXT,
        checkpoints_action TEXT,
        checkpoints_entry TEXT,
        status TEXT NOT NULL DEFAULT 'launching',
        exit_code INTEGER,
        error TEXT
    );
    CREATE INDEX experiments_target ON experiments(target, id);
    """,
    """
    CREATE TABLE metrics (
        experiment INTEGER PRIMARY KEY REFERENCES experiments(id),
        updated REAL NOT NULL,
        log_offset INTEGER NOT NULL DEFAULT 0,
        series TEXT NOT NULL DEFAULT '{}',
        summary TEXT NOT NULL DEFAULT '{}'
    );
    """,
    """
    ALTER TABLE experiments ADD COLUMN machine TEXT;
    CREATE INDEX experiments_machine ON experiments(machine, id);
    """,
    """
    ALTER TABLE experiments ADD COLUMN attempts TEXT;
    """,
    # this registry's id, the prefix of its run folders on a target (runs/<id>-<n>), so that two clones of a
    # project sharing a target never collide; experiments numbered below keyed_from have plain runs/<n> folders
    """
    CREATE TABLE registry_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    INSERT INTO registry_meta VALUES ('id', lower(hex(randomblob(6))));
    INSERT INTO registry_meta SELECT 'keyed_from', 1 + MAX(COALESCE((SELECT MAX(id) FROM experiments), 0),
        COALESCE((SELECT MAX(seq) FROM sqlite_sequence WHERE name = 'experiments'), 0));
    """,
    """
    ALTER TABLE experiments ADD COLUMN nodes TEXT;
    """,
    # how a run ended, in words: who stopped it, which signal and why, "end time unknown, noticed at ..."
    """
    ALTER TABLE experiments ADD COLUMN end_reason TEXT;
    """,
]

_JSON_FIELDS = ("target_info", "revision_files", "config", "batching", "batching_plan", "attempts", "nodes")


class Experiment(BaseModel):
    id: int
    project: str
    message: str | None = None
    created: float
    started: float | None = None
    ended: float | None = None
    target: str
    target_info: dict = {}
    machine: str | None = None  # what the target reaches (targets.machine_key): runs belong to it, not to a name
    revision: str
    revision_files: list = []
    git_commit: str | None = None
    git_dirty: bool | None = None
    git_diff: str | None = None
    command: list[str] | str  # as written: a shell line, or an argument list
    config: dict = {}
    batching: dict = {}
    batching_plan: dict | None = None
    parent: int | None = None
    checkpoints: str | None = None
    checkpoints_action: str | None = None
    checkpoints_entry: str | None = None
    status: str = "launching"
    exit_code: int | None = None
    error: str | None = None
    attempts: list | None = None  # the supervisor's attempts.json entries: start, end, exit code, reason, resumed-from
    nodes: list | None = None  # a job over several nodes: one record per node (multinode.py), node 0 first
    end_reason: str | None = None  # "stopped by experiment 7", "SIGHUP: the tmux server went away", ...

    def public(self) -> dict:
        """The record as ``orch experiments show --json`` prints it."""
        out = self.model_dump(exclude={"revision_files", "git_diff"})
        out["files"] = len(self.revision_files)
        out["secrets"] = self.secret_names
        return out

    @property
    def secret_names(self) -> list[str]:
        """The names of the secrets the run received (their values are never recorded)."""
        return list((self.config.get("project") or {}).get("secrets") or [])


class Registry:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise OrchError(f"cannot open the experiment registry {self.path}: {exc}",
                            hint="check that the project folder is writable") from exc
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA foreign_keys=ON")
        deadline = time.monotonic() + 30.0
        while True:  # switching to WAL and migrating need a moment of exclusivity: another orch may hold it
            try:
                self.db.execute("PRAGMA journal_mode=WAL")
                self._migrate()
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise OrchError(f"cannot open the experiment registry {self.path}: {exc}",
                                    hint="another orch process may be stuck holding it; retry") from exc
                time.sleep(0.05)

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise OrchError(f"{self.path} was written by a newer orch (schema {version})",
                            hint="upgrade orch to read it")
        for i, sql in enumerate(MIGRATIONS[version:], start=version + 1):
            self.db.execute("BEGIN IMMEDIATE")
            try:
                if self.db.execute("PRAGMA user_version").fetchone()[0] < i:
                    for stmt in filter(str.strip, sql.split(";")):
                        self.db.execute(stmt)
                    self.db.execute(f"PRAGMA user_version = {i}")
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        self.db.close()

    def _meta(self, key: str) -> str:
        return self.db.execute("SELECT value FROM registry_meta WHERE key = ?", (key,)).fetchone()[0]

    @property
    def registry_id(self) -> str:
        """12 hex digits, random, made when the registry was: this clone's runs on a target carry it."""
        return self._meta("id")

    def run_registry(self, exp_id: int) -> str | None:
        """The registry id in experiment ``exp_id``'s run folder name; None for runs from before the keys."""
        return None if exp_id < int(self._meta("keyed_from")) else self.registry_id

    def owns(self, run: dict) -> bool:
        """Whether a run the target reports (its ``id`` and ``registry``) is this registry's experiment."""
        return run.get("id") is not None and run.get("registry") == self.run_registry(int(run["id"]))

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self, min_id: int = 1, launcher: LaunchGuard | None = None, **fields: Any) -> Experiment:
        """A new experiment numbered after every earlier one, and at least ``min_id``.

        ``launcher`` takes its lock before the row is visible, so no reader sees the row without it.
        """
        fields.setdefault("created", time.time())
        fields.setdefault("status", "launching")
        row = {k: (json.dumps(v) if k in _JSON_FIELDS or k == "command" else v) for k, v in fields.items()}
        self.db.execute("BEGIN IMMEDIATE")
        try:
            last = self.db.execute("SELECT MAX(seq) FROM sqlite_sequence WHERE name = 'experiments'").fetchone()[0]
            row["id"] = max(int(last or 0) + 1, min_id)
            if launcher is not None:
                launcher.hold(row["id"])
            cols = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            self.db.execute(f"INSERT INTO experiments ({cols}) VALUES ({marks})", list(row.values()))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return self.get(row["id"])

    def update(self, exp_id: int, **fields: Any) -> Experiment:
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"bad status {fields['status']!r}")
        row = {k: (json.dumps(v) if k in _JSON_FIELDS or k == "command" else v) for k, v in fields.items()}
        sets = ", ".join(f"{k} = ?" for k in row)
        self.db.execute(f"UPDATE experiments SET {sets} WHERE id = ?", [*row.values(), exp_id])
        return self.get(exp_id)

    def _from_row(self, row: sqlite3.Row) -> Experiment:
        data = dict(row)
        for k in (*_JSON_FIELDS, "command"):
            if data.get(k) is not None:
                data[k] = json.loads(data[k])
        if data.get("git_dirty") is not None:
            data["git_dirty"] = bool(data["git_dirty"])
        return Experiment.model_validate(data)

    def get(self, exp_id: int) -> Experiment:
        row = self.db.execute("SELECT * FROM experiments WHERE id = ?", (exp_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no experiment {exp_id} in {self.path}", hint="see orch experiments list")
        return self._from_row(row)

    def list(self, target: str | None = None, status: str | None = None, limit: int | None = None,
             machine: str | None = None) -> list[Experiment]:
        sql, args = "SELECT * FROM experiments WHERE 1=1", []
        if target:
            sql += " AND target = ?"
            args.append(target)
        if machine:
            sql += " AND machine = ?"
            args.append(machine)
        if status:
            sql += " AND status = ?"
            args.append(status)
        sql += " ORDER BY id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [self._from_row(r) for r in self.db.execute(sql, args)]

    def latest(self, machine: str, target: str | None = None) -> Experiment | None:
        """The newest experiment on ``machine`` that reached it (failed or still launching ones do not count).

        A running one comes first: two deploys racing are numbered before they queue for the target's lock,
        so the higher id can be the one the other replaced. Rows recorded before machines were
        (``machine`` NULL) match by their ``target`` name.
        """
        row = self.db.execute("SELECT * FROM experiments WHERE (machine = ? OR (machine IS NULL AND target = ?)) "
                              "AND status NOT IN ('failed', 'launching') ORDER BY status = 'running' DESC, id DESC "
                              "LIMIT 1", (machine, target)).fetchone()
        return self._from_row(row) if row else None

    def orphans(self, machine: str, target: str | None, project: str) -> list[Experiment]:
        """``launching`` experiments of ``project`` on ``machine`` whose launching process is gone."""
        rows = self.db.execute("SELECT id FROM experiments WHERE (machine = ? OR (machine IS NULL AND target = ?)) "
                               "AND project = ? AND status = 'launching' ORDER BY id", (machine, target, project))
        found = []
        for (exp_id,) in rows.fetchall():
            if not launcher_alive(self.path.parent, exp_id):
                exp = self.get(exp_id)  # read again: its launcher may have recorded it just before leaving
                if exp.status == "launching":
                    found.append(exp)
        return found

    def unsettled(self, machine: str, target: str | None, project: str) -> list[Experiment]:
        """Every experiment of ``project`` on ``machine`` whose record can still change (launching, running, lost)."""
        rows = self.db.execute("SELECT * FROM experiments WHERE (machine = ? OR (machine IS NULL AND target = ?)) "
                               "AND project = ? AND status IN ('launching', 'running', 'lost') ORDER BY id",
                               (machine, target, project))
        return [self._from_row(r) for r in rows.fetchall()]

    def orphaned(self, exp: Experiment) -> bool:
        """Whether ``exp`` is a launch whose process is gone and whose target has not been asked yet."""
        return exp.status == "launching" and not launcher_alive(self.path.parent, exp.id)

    def settle(self, exp_id: int, **fields: Any) -> Experiment:
        """Record what the target said about an orphaned launch; its lock file goes with it."""
        exp = self.update(exp_id, **fields)
        forget(self.path.parent, exp_id)
        return exp

    def save_metrics(self, exp_id: int, log_offset: int, series: dict, summary: dict) -> None:
        self.db.execute(
            "INSERT INTO metrics (experiment, updated, log_offset, series, summary) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(experiment) DO UPDATE SET updated=excluded.updated, log_offset=excluded.log_offset, "
            "series=excluded.series, summary=excluded.summary",
            (exp_id, time.time(), log_offset, json.dumps(series), json.dumps(summary)))

    def metrics(self, exp_id: int) -> dict | None:
        row = self.db.execute("SELECT * FROM metrics WHERE experiment = ?", (exp_id,)).fetchone()
        if row is None:
            return None
        return {"updated": row["updated"], "log_offset": row["log_offset"], "series": json.loads(row["series"]),
                "summary": json.loads(row["summary"])}
