"""The experiment registry: one SQLite file per project, ``.orch/experiments.db``.

The only module that imports sqlite3. The schema is versioned with ``PRAGMA user_version`` and
upgraded by the ordered ``MIGRATIONS``; WAL mode and a busy timeout let two orch processes (two
deploys racing) write without corrupting anything.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from . import faults
from .. import after_answer
from ..errors import ConflictError, DiskFull, InputError, NotFoundError, OrchError, RegistryCorrupt
from .launch_guard import LaunchGuard, forget, launcher_alive

STATUSES = ("launching", "queued", "running", "finished", "crashed", "stopped", "failed", "lost")
# "queued": handed to the target's queue (deploy --queue, a sweep's variants); it starts when the run before it ends
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
    # the GPUs a run was given (orch deploy --gpus N): [{"index": 0, "uuid": "GPU-…"}, …], and what status read
    # of them: [[time, [[utilisation %, memory MiB], …]], …]
    """
    ALTER TABLE experiments ADD COLUMN gpus TEXT;
    ALTER TABLE experiments ADD COLUMN gpu_series TEXT;
    """,
    # the run's environment ([env]): its hash on the target, the spec it was built from, what it holds
    """
    ALTER TABLE experiments ADD COLUMN env TEXT;
    """,
    # the sweep an experiment is a variant of (orch sweep): its id, shared by the variants
    """
    ALTER TABLE experiments ADD COLUMN sweep TEXT;
    CREATE INDEX experiments_sweep ON experiments(sweep, id);
    """,
    # a machine's experiments by state, which every status and deploy looks up (``_on_machine``): answered from
    # this index alone, however long the project's history
    """
    CREATE INDEX experiments_machine_status ON experiments(machine, status, id);
    """,
]

# the ids of the experiments on machine ?1 (rows from before machines: named by target ?2) in the states that follow,
# each half from experiments_machine_status (``+target``: not from experiments_target, which holds every row of
# that name); ``_on_machine`` fills in the states
_ON_MACHINE = ("SELECT id FROM experiments WHERE machine = ?1 AND status {op} {states} UNION ALL "
               "SELECT id FROM experiments WHERE machine IS NULL AND +target = ?2 AND status {op} {states}")


def _on_machine(op: str, states: int, first: int = 3) -> str:
    """``_ON_MACHINE`` for ``states`` states, bound as ?first, ?first+1...: ``op`` "=" (one), "IN" or "NOT IN"."""
    marks = ", ".join(f"?{first + i}" for i in range(states))
    return _ON_MACHINE.format(op=op, states=marks if op == "=" else f"({marks})")


def command_line(command: str | list[str]) -> str:
    """A command as its user wrote it: the line itself, or the list quoted as a shell would need it."""
    return command if isinstance(command, str) else shlex.join(command)


def clone(settings: Any) -> dict:
    """Which clone of the project starts a run (recorded in its experiment.json): another clone that stops
    it can say whose run it stopped."""
    import socket

    return {"host": socket.gethostname(), "path": str(settings.project_dir)}


_JSON_FIELDS = ("target_info", "revision_files", "config", "batching", "batching_plan", "attempts", "nodes",
                "gpus", "gpu_series", "env")


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
    gpus: list | None = None  # the GPUs it was given (--gpus N): index and UUID each; None: not chosen by orch
    gpu_series: list | None = None  # their utilisation and memory as status read them (watch/gpu_use.py)
    env: dict | None = None  # [env]: {"hash", "spec", "packages": {name: version}} (launch/envs.py)
    sweep: str | None = None  # the sweep it is a variant of (orch sweep)

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


LOCK_WAIT = 30.0  # s a command waits for another's write transaction before it gives up ([run] registry_timeout)
ID_MAX = 2**63 - 1  # SQLite's largest integer


class Registry:
    """The registry file, opened for one command.

    On a full disk it opens read-only (``writable`` False): reads work, writes of what a command learnt are
    skipped with a warning (the target's run folders keep the truth; the next command records it), and a new
    launch is refused. A lock held by another process is waited for, with a message, up to ``lock_wait`` s.
    ``mirror`` (``[mlflow] mirror``) is given, when the registry closes, the ids of the experiments whose record
    or metrics this command wrote; it must not raise. ``park``: the command's own registry, whose closing checkpoint
    may wait until the command's answer is out (``after_answer``). ``read_only``: a reader beside the commands
    (``orch ui``): it never writes or takes a lock, each read is its own short transaction, so it never holds up
    a command; a registry not made yet, or not at this orch's schema, is a ``NotFoundError``.
    """

    def __init__(self, path: Path, notice: Callable[[str], None] | None = None,
                 mirror: Callable[["Registry", list[int]], None] | None = None,
                 lock_wait: float = LOCK_WAIT, park: bool = False, read_only: bool = False) -> None:
        self.path = Path(path)
        self.park = park  # the command's own registry: closed after its answer (``after_answer``) where it can be
        self.lock_wait = lock_wait
        self.notice = notice or (lambda line: print(line, file=sys.stderr, flush=True))
        self.mirror = mirror
        self.changed: set[int] = set()  # experiments whose row or metrics this command wrote
        self.writable = True
        self.skipped: set[int] = set()  # experiments whose new state this command could not write
        self._stuck: ConflictError | None = None  # why this command gave up writing (the registry stayed locked)
        self._told_unwritten = False
        self._meta_values: dict[str, str] = {}
        # rows decoded, by id, with the values they held: a row read again unchanged is not decoded again (a row
        # another process or a rolled-back write changed holds other values, and is decoded anew)
        self._decoded: dict[int, tuple[tuple, Experiment]] = {}
        self.read_only = read_only
        if read_only:
            self._open_reader()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), timeout=1.0, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            if faults.full(self.path):
                raise DiskFull(f"cannot make the experiment registry {self.path}: no space left "
                               f"({faults.space(self.path)})",
                               hint=f"free space on the file system of {self.path.parent}") from exc
            raise OrchError(f"cannot open the experiment registry {self.path}: {exc}",
                            hint="check that the project folder is writable") from exc
        self.db.row_factory = sqlite3.Row
        try:
            self._exec("PRAGMA foreign_keys=ON")
            self._exec("PRAGMA journal_mode=WAL")
            self._migrate()
        except DiskFull:
            if not self.path.exists() or not self.writable:
                raise
            self.db.close()
            self.db = self._read_only()
            self._migrate()

    def _open_reader(self) -> None:
        self.writable = False
        try:
            self.db = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True, timeout=1.0,
                                      isolation_level=None)
        except sqlite3.Error as exc:
            raise NotFoundError(f"no experiment registry at {self.path} yet",
                                hint="orch deploy records the first experiment") from exc
        self.db.row_factory = sqlite3.Row
        if self._exec("PRAGMA user_version", fetch="one")[0] != len(MIGRATIONS):
            self.db.close()
            raise NotFoundError(f"the experiment registry {self.path} is not at this orch's schema",
                                hint="any orch command that records (orch status) upgrades it; or upgrade orch")

    def _read_only(self) -> sqlite3.Connection:
        """The file as it is, for reading without a lock or a ``-shm`` beside it (which needs free space)."""
        self.writable = False
        db = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?immutable=1", uri=True,
                             isolation_level=None)
        db.row_factory = sqlite3.Row
        self.notice(f"orch: warning: the experiment registry {self.path} cannot be written: no space left "
                    f"({faults.space(self.path)}); reading it as it was. What this command does on the target "
                    "is recorded by the next command run with free space there")
        return db

    def _exec(self, sql: str, args: Sequence[Any] = (), fetch: str | None = None) -> Any:
        """``db.execute`` (and its ``fetchone``/``fetchall`` with ``fetch="one"``/``"all"``) with SQLite's
        failures said as orch errors; a busy registry is waited for."""
        deadline = None
        while True:
            try:
                cursor = self.db.execute(sql, args)
                return cursor.fetchone() if fetch == "one" else cursor.fetchall() if fetch == "all" else cursor
            except OverflowError as exc:
                raise InputError(f"a number is out of range for the experiment registry: {exc}",
                                 hint=f"ids run from 1 to {ID_MAX}") from None
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorname not in ("SQLITE_BUSY", "SQLITE_LOCKED") and "locked" not in str(exc):
                    raise self._translated(exc) from exc
                now = time.monotonic()
                holder = faults.holder(self.path)
                who = f" (pid {holder[0]}: {holder[1] or '?'})" if holder else ""
                if deadline is None:
                    deadline = now + self.lock_wait - 1.0  # the first second went to SQLite's own busy wait
                    self.notice(f"orch: the experiment registry {self.path} is locked by another process{who}; "
                                f"waiting up to {self.lock_wait:g} s")
                if now >= deadline:
                    raise ConflictError(
                        f"the experiment registry {self.path} stayed locked for {self.lock_wait:g} s by another "
                        f"process{who}",
                        hint=f"wait for it to finish, or end it if it is stuck (kill {holder[0]}); then retry"
                        if holder else "wait for the other orch command to finish, or end it if it is stuck; "
                                       "then retry") from exc
            except sqlite3.DatabaseError as exc:
                raise self._translated(exc) from exc

    def _translated(self, exc: sqlite3.Error) -> OrchError:
        name = getattr(exc, "sqlite_errorname", "") or ""
        if name.startswith(("SQLITE_FULL", "SQLITE_IOERR")) and faults.full(self.path):
            return DiskFull(f"the experiment registry {self.path} cannot be written: no space left "
                            f"({faults.space(self.path)})",
                            hint=f"free space on the file system of {self.path.parent}, then run the command "
                                 "again; runs on the targets go on, and the next command records them")
        if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
            return RegistryCorrupt(f"the experiment registry {self.path} is corrupt ({exc}); it was left "
                                   "untouched",
                                   hint="`orch experiments rebuild` makes a new one from the run folders on the "
                                        "targets (the corrupt file is kept aside)")
        return OrchError(f"the experiment registry {self.path} failed: {exc}",
                         hint=f"SQLite said {name or 'an error'}; check the file and its folder")

    def _reader_writes(self) -> None:
        if self.read_only:  # a bug, not a state of the file: a reader is never handed what writes
            raise OrchError(f"the experiment registry {self.path} is open read-only here",
                            hint="a reader beside the commands (orch ui) never writes the registry")

    def require_writable(self) -> None:
        """Refuse, before anything is done on a target, what must be recorded (a new launch)."""
        self._reader_writes()
        if self._stuck is not None:
            raise self._stuck
        if not self.writable:
            raise DiskFull(f"the experiment registry {self.path} cannot be written: no space left "
                           f"({faults.space(self.path)}), so a new experiment cannot be recorded",
                           hint=f"free space on the file system of {self.path.parent}; nothing was changed on "
                                "the target (orch stop and orch status still work)")

    def _unwritten(self, what: str, why: str | None = None) -> None:
        if not self._told_unwritten:
            self._told_unwritten = True
            self.notice(f"orch: warning: {what} is not recorded in {self.path} ("
                        + (why or f"no space left, {faults.space(self.path)}")
                        + "); the next command records it from the target")

    def _migrate(self) -> None:
        version = self._exec("PRAGMA user_version", fetch="one")[0]
        if version > len(MIGRATIONS):
            raise OrchError(f"{self.path} was written by a newer orch (schema {version})",
                            hint="upgrade orch to read it")
        if version < len(MIGRATIONS) and not self.writable:
            raise DiskFull(f"the experiment registry {self.path} must be upgraded and there is no space left "
                           f"({faults.space(self.path)})", hint=f"free space on the file system of {self.path.parent}")
        for i, sql in enumerate(MIGRATIONS[version:], start=version + 1):
            self._exec("BEGIN IMMEDIATE")
            try:
                if self._exec("PRAGMA user_version", fetch="one")[0] < i:
                    for stmt in filter(str.strip, sql.split(";")):
                        self._exec(stmt)
                    self._exec(f"PRAGMA user_version = {i}")
                self._exec("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.rollback()
                raise

    def close(self, mirror: bool = True) -> None:
        """Closes the file; a ``mirror`` first gets the experiments this command changed (once each)."""
        changed, self.changed = sorted(self.changed), set()
        try:
            if mirror and changed and self.mirror is not None:
                self.mirror(self, changed)
        except Exception as exc:  # a mirror never fails the command that changed the record
            self.notice(f"orch: warning: experiment(s) {', '.join(map(str, changed))} not mirrored: {exc}")
        finally:
            if self.park:  # its checkpoint after the answer, where a warm process runs the command
                after_answer.park(self.db.close)
            else:  # a file made or moved by the caller next (a rebuilt registry) is whole when this returns
                self.db.close()

    @classmethod
    def write_new(cls, path: Path, registry_id: str, keyed_from: int, rows: list[dict]) -> None:
        """A new registry file at ``path`` (absent) with ``rows`` (validated) under ``registry_id``."""
        with cls(path) as reg:
            reg._exec("BEGIN IMMEDIATE")
            try:
                reg._exec("UPDATE registry_meta SET value = ? WHERE key = 'id'", (registry_id,))
                reg._exec("UPDATE registry_meta SET value = ? WHERE key = 'keyed_from'", (str(keyed_from),))
                reg._meta_values.clear()
                for fields in rows:
                    data = Experiment.model_validate(fields).model_dump(exclude_none=True)
                    data["git_dirty"] = None if data.get("git_dirty") is None else int(data["git_dirty"])
                    row = {k: (json.dumps(v) if k in _JSON_FIELDS or k == "command" else v) for k, v in data.items()}
                    reg._exec(f"INSERT INTO experiments ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                              list(row.values()))
                reg._exec("COMMIT")
            except BaseException:
                if reg.db.in_transaction:
                    reg.db.rollback()
                raise

    def _meta(self, key: str) -> str:
        """A value of ``registry_meta`` (made with the file, never changed after): read once per command."""
        if key not in self._meta_values:
            self._meta_values[key] = self._exec("SELECT value FROM registry_meta WHERE key = ?", (key,),
                                                fetch="one")[0]
        return self._meta_values[key]

    @contextmanager
    def batch(self) -> Iterator[None]:
        """The writes inside it in one transaction, committed at its end (one sync of the file for a command that
        records what many targets said, or a launch's results). Where the registry cannot be written, or stays
        locked past ``LOCK_WAIT``, the writes are skipped with their warning, as each would be alone."""
        if not self.writable or self._stuck is not None or self.db.in_transaction:
            yield
            return
        try:
            self._exec("BEGIN IMMEDIATE")
        except DiskFull:
            self.writable = False
            yield
            return
        except ConflictError as exc:  # held past LOCK_WAIT: the writes are skipped, as one that waited that long
            self._stuck = exc
            yield
            return
        before = set(self.changed)
        try:
            yield
        except BaseException:
            if self.db.in_transaction:
                self.db.rollback()
            raise
        if not self.db.in_transaction:  # SQLite ended it on an error a write was told
            return
        try:
            self._exec("COMMIT")
        except (DiskFull, ConflictError) as exc:
            if self.db.in_transaction:
                self.db.rollback()
            self.writable = not isinstance(exc, DiskFull)
            self.skipped.update(self.changed - before)
            self._unwritten("what this command learnt", exc.message if isinstance(exc, ConflictError) else None)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction of its own, or a savepoint inside a ``batch``."""
        nested = self.db.in_transaction
        self._exec("SAVEPOINT own" if nested else "BEGIN IMMEDIATE")
        try:
            yield
            self._exec("RELEASE own" if nested else "COMMIT")
        except BaseException:
            if nested and self.db.in_transaction:
                self.db.execute("ROLLBACK TO own")
                self.db.execute("RELEASE own")
            elif self.db.in_transaction:
                self.db.rollback()
            raise

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

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        self.close(mirror=exc_type is None or issubclass(exc_type, Exception))  # not on the way out of a Ctrl-C

    def create(self, min_id: int = 1, launcher: LaunchGuard | None = None, **fields: Any) -> Experiment:
        """A new experiment numbered after every earlier one, and at least ``min_id``.

        ``launcher`` takes its lock before the row is visible, so no reader sees the row without it.
        """
        self.require_writable()
        fields.setdefault("created", time.time())
        fields.setdefault("status", "launching")
        row = {k: (json.dumps(v) if k in _JSON_FIELDS or k == "command" else v) for k, v in fields.items()}
        with self._transaction():
            last = self._exec("SELECT MAX(seq) FROM sqlite_sequence WHERE name = 'experiments'", fetch="one")[0]
            row["id"] = max(int(last or 0) + 1, min_id)
            if launcher is not None:
                launcher.hold(row["id"])
            cols = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            self._exec(f"INSERT INTO experiments ({cols}) VALUES ({marks})", list(row.values()))
        self.changed.add(row["id"])
        return self.get(row["id"])

    def reserve(self) -> int:
        """The next number, kept for a row that only a target can know is needed (a guard's restored run,
        recorded by ``records.guard_records``); ``create`` numbers after it. Unused, it stays a gap."""
        self.require_writable()
        with self._transaction():
            last = int(self._exec("SELECT MAX(seq) FROM sqlite_sequence WHERE name = 'experiments'",
                                  fetch="one")[0] or 0)
            self._exec("UPDATE sqlite_sequence SET seq = ? WHERE name = 'experiments'", (last + 1,))
        return last + 1

    def insert_reserved(self, exp_id: int, **fields: Any) -> Experiment:
        """The row of a number ``reserve`` kept, once its run exists."""
        self.require_writable()
        fields.setdefault("created", time.time())
        row = {k: (json.dumps(v) if k in _JSON_FIELDS or k == "command" else v) for k, v in fields.items()}
        row["id"] = int(exp_id)
        self._exec(f"INSERT OR IGNORE INTO experiments ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                   list(row.values()))
        return self.get(exp_id)

    def update(self, exp_id: int, **fields: Any) -> Experiment:
        self._reader_writes()
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"bad status {fields['status']!r}")
        row = {k: (json.dumps(v) if k in _JSON_FIELDS or k == "command" else v) for k, v in fields.items()}
        sets = ", ".join(f"{k} = ?" for k in row)
        if self.writable and self._stuck is None:
            try:
                self._exec(f"UPDATE experiments SET {sets} WHERE id = ?", [*row.values(), exp_id])
                self.changed.add(exp_id)
                return self.get(exp_id)
            except DiskFull:
                self.writable = False
            except ConflictError as exc:  # held past lock_wait: what the target did is not lost for that
                self._stuck = exc
        # the target keeps the truth: the next command that can write records it
        self._unwritten(f"experiment {exp_id}'s new state", self._stuck.message if self._stuck else None)
        self.skipped.add(exp_id)
        return self.get(exp_id).model_copy(update=fields)

    def _from_row(self, row: sqlite3.Row) -> Experiment:
        values = tuple(row)
        known = self._decoded.get(row["id"])
        if known is not None and known[0] == values:
            return known[1]
        data = dict(row)
        for k in (*_JSON_FIELDS, "command"):
            if data.get(k) is not None:
                data[k] = json.loads(data[k])
        if data.get("git_dirty") is not None:
            data["git_dirty"] = bool(data["git_dirty"])
        exp = Experiment.model_validate(data)
        self._decoded[exp.id] = (values, exp)
        return exp

    def get(self, exp_id: int) -> Experiment:
        if not 0 <= exp_id <= ID_MAX:
            raise InputError(f"no experiment can have the id {exp_id}", hint=f"ids run from 1 to {ID_MAX}")
        row = self._exec("SELECT * FROM experiments WHERE id = ?", (exp_id,), fetch="one")
        if row is None:
            raise NotFoundError(f"no experiment {exp_id} in {self.path}", hint="see orch experiments list")
        return self._from_row(row)

    def list(self, target: str | None = None, status: str | None = None, limit: int | None = None,
             machine: str | None = None, sweep: str | None = None) -> list[Experiment]:
        return list(self.newest(target, status, limit, machine, sweep))

    def newest(self, target: str | None = None, status: str | None = None, limit: int | None = None,
               machine: str | None = None, sweep: str | None = None) -> Iterator[Experiment]:
        """``list``'s experiments, newest first, each decoded when it is reached: a search that stops at the first
        match decodes no more rows."""
        sql, args = "SELECT * FROM experiments WHERE 1=1", []
        if sweep:
            sql += " AND sweep = ?"
            args.append(sweep)
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
        for row in self._exec(sql, args, fetch="all"):
            yield self._from_row(row)

    def places(self, project: str) -> list[tuple[int, str | None, str]]:
        """(id, machine, target) of every experiment of ``project``, newest first, read without decoding the rows."""
        return [(r["id"], r["machine"], r["target"]) for r in self._exec(
            "SELECT id, machine, target FROM experiments WHERE project = ? ORDER BY id DESC", (project,), fetch="all")]

    def env_users(self, machine: str) -> dict[str, list[int]]:
        """The experiments on ``machine`` by the hash of the environment each ran in, reading only that column."""
        out: dict[str, list[int]] = {}
        for row in self._exec("SELECT id, env FROM experiments WHERE machine = ? AND env IS NOT NULL ORDER BY id",
                              (machine,), fetch="all"):
            env = json.loads(row["env"])
            if isinstance(env, dict) and env.get("hash"):
                out.setdefault(env["hash"], []).append(row["id"])
        return out

    def latest_by_place(self, window: int = 500) -> list[Experiment]:
        """The newest experiment of each machine (a row from before machines: of each target name) among the newest
        ``window`` rows, ordered by that name: only the rows shown are decoded, however long the history."""
        rows = self._exec("SELECT * FROM experiments WHERE id IN (SELECT MAX(id) FROM (SELECT id, "
                          "COALESCE(NULLIF(machine, ''), target) AS place FROM experiments ORDER BY id DESC LIMIT ?) "
                          "GROUP BY place)", (int(window),), fetch="all")
        found = [self._from_row(r) for r in rows]
        return sorted(found, key=lambda e: e.machine or e.target)

    def latest(self, machine: str, target: str | None = None, queued: bool = False) -> Experiment | None:
        """The newest experiment on ``machine`` that reached it (failed or still launching ones do not count;
        queued ones only with ``queued``: a Slurm job pending for its nodes is the cluster's latest run).

        A running one comes first: two deploys racing are numbered before they queue for the target's lock,
        so the higher id can be the one the other replaced. Rows recorded before machines were
        (``machine`` NULL) match by their ``target`` name.
        """
        running, reached = _on_machine("=", 1), _on_machine("NOT IN", 3, first=4)
        row = self._exec(f"SELECT * FROM experiments WHERE id = COALESCE((SELECT MAX(id) FROM ({running})), "
                         f"(SELECT MAX(id) FROM ({reached})))",
                         (machine, target, "running", "failed", "launching", "failed" if queued else "queued"),
                         fetch="one")
        return self._from_row(row) if row else None

    def orphans(self, machine: str, target: str | None, project: str) -> list[Experiment]:
        """``launching`` experiments of ``project`` on ``machine`` whose launching process is gone."""
        rows = self._exec(f"SELECT id FROM experiments WHERE id IN ({_on_machine('=', 1)}) AND project = ?4 "
                          "ORDER BY id", (machine, target, "launching", project), fetch="all")
        found = []
        for (exp_id,) in rows:
            if not launcher_alive(self.path.parent, exp_id):
                exp = self.get(exp_id)  # read again: its launcher may have recorded it just before leaving
                if exp.status == "launching":
                    found.append(exp)
        return found

    def unsettled(self, machine: str, target: str | None, project: str) -> list[Experiment]:
        """Every experiment of ``project`` on ``machine`` whose record can still change (launching, queued, running,
        lost)."""
        rows = self._exec(f"SELECT * FROM experiments WHERE id IN ({_on_machine('IN', 4)}) AND project = ?7 "
                          "ORDER BY id", (machine, target, "launching", "queued", "running", "lost", project),
                          fetch="all")
        return [self._from_row(r) for r in rows]

    def orphaned(self, exp: Experiment) -> bool:
        """Whether ``exp`` is a launch whose process is gone and whose target has not been asked yet."""
        return exp.status == "launching" and not launcher_alive(self.path.parent, exp.id)

    def settle(self, exp_id: int, **fields: Any) -> Experiment:
        """Record what the target said about an orphaned launch; its lock file goes with it."""
        exp = self.update(exp_id, **fields)
        if exp_id not in self.skipped:  # else its lock file says "launching, launcher gone" until the row is written
            forget(self.path.parent, exp_id)
        return exp

    def save_metrics(self, exp_id: int, log_offset: int, series: dict, summary: dict) -> None:
        self._reader_writes()
        if not self.writable or self._stuck is not None:
            return  # read again from the log by the next command
        try:
            self._exec(
                "INSERT INTO metrics (experiment, updated, log_offset, series, summary) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(experiment) DO UPDATE SET updated=excluded.updated, log_offset=excluded.log_offset, "
                "series=excluded.series, summary=excluded.summary",
                (exp_id, time.time(), log_offset, json.dumps(series), json.dumps(summary)))
            self.changed.add(exp_id)
        except DiskFull:
            self.writable = False
            self._unwritten(f"experiment {exp_id}'s metrics")
        except ConflictError as exc:
            self._stuck = exc
            self._unwritten(f"experiment {exp_id}'s metrics", exc.message)

    def summaries(self, ids: Sequence[int]) -> dict[int, dict]:
        """The metric summaries (what status shows) of experiments ``ids``, read without their series."""
        out: dict[int, dict] = {}
        ids = [int(i) for i in ids]
        for start in range(0, len(ids), 500):  # SQLite's bound on a statement's variables
            part = ids[start:start + 500]
            rows = self._exec(f"SELECT experiment, summary FROM metrics WHERE experiment IN "
                              f"({', '.join('?' for _ in part)})", part, fetch="all")
            out.update({r["experiment"]: json.loads(r["summary"]) for r in rows})
        return out

    def metrics(self, exp_id: int) -> dict | None:
        row = self._exec("SELECT * FROM metrics WHERE experiment = ?", (exp_id,), fetch="one")
        if row is None:
            return None
        return {"updated": row["updated"], "log_offset": row["log_offset"], "series": json.loads(row["series"]),
                "summary": json.loads(row["summary"])}


def listing(registry: Registry, rows: list[Experiment]) -> list[dict]:
    """Experiments as ``orch experiments list --json`` prints them (and ``orch ui``'s API answers)."""
    return [e.public() | {"orphaned": registry.orphaned(e)} for e in rows]


def record(registry: Registry, exp: Experiment) -> dict:
    """One experiment as ``orch experiments show --json`` prints it: its record and its metric summary."""
    data = exp.public()
    data["metrics"] = {k: v for k, v in ((registry.metrics(exp.id) or {}).get("summary") or {}).items()
                       if k != "_state"}
    return data


def salvage(path: Path) -> dict:
    """What can still be read from a damaged registry: its id and the targets its experiments ran on ({} if none)."""
    out: dict = {}
    try:
        db = sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?immutable=1", uri=True)
    except sqlite3.Error:
        return out
    try:
        for key, sql in (("registry_id", "SELECT value FROM registry_meta WHERE key = 'id'"),
                         ("keyed_from", "SELECT value FROM registry_meta WHERE key = 'keyed_from'"),
                         ("targets", "SELECT DISTINCT target FROM experiments")):
            try:
                rows = db.execute(sql).fetchall()
            except sqlite3.Error:
                continue
            out[key] = [r[0] for r in rows] if key == "targets" else (rows[0][0] if rows else None)
    finally:
        db.close()
    return {k: v for k, v in out.items() if v}
