"""Every controller-side checkpoint decision: the ``ckpt_*`` ops, retention, confirmation, putting back.

The agent (``orchestrator.agent.ckpt.checkpoints``) moves files on the target; this module decides what to ask
of it. Op arguments, retention limits, who wrote a folder and what to say are pure functions; the rest
calls the agent through the ``AgentClient`` it is given (or opens one, for ``orch checkpoints ...``)::

    ops = probe_ops(target, settings, "move")        # ckpt_check + ckpt_inventory, before anything changes
    ops = [check_op(target, stopping=[6]), ...,      # in the locked apply: safe to move once run 6 stops
           trash_op(target, settings, "move", inv, writer, stopping=[6], parent=6, moved_by=7)]
    back = put_back(target, settings, entry, entry_path, client=client, what="...")
    registry.update(7, **back.fields); print(back.said)
    inv = listing(settings, target, open_registry)   # orch checkpoints list
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ContextManager, NamedTuple

from .errors import InputError, OrchError, cancelled
from .reach.agent_client import AgentClient, Op

if TYPE_CHECKING:
    from .config import Settings
    from .reach.targets import Target
    from .records.experiments import Experiment, Registry

    OpenRegistry = Callable[[], ContextManager[Registry]]
    Confirm = Callable[[str], bool] | None

# registry fields of an experiment whose moved checkpoints are back in the folder
RESTORED = {"checkpoints_action": "restored", "checkpoints_entry": None}


def folder(target: Target, path: str | None = None) -> dict:
    """The arguments every ``ckpt_*`` op starts with: the folder (the lineage's, or ``path``: an experiment's
    own beside it), and the one the configuration names."""
    return {"path": path or target.checkpoints, "configured": target.checkpoints}


def retention(settings: Settings) -> dict:
    """``[trash] keep`` / ``max_gb`` as the agent's ``keep`` / ``max_bytes`` (None: no limit)."""
    max_gb = settings.trash.max_gb
    return {"keep": settings.trash.keep, "max_bytes": int(max_gb * (1 << 30)) if max_gb else None}


def doomed(inv: dict | None) -> list[str]:
    """The trash entries a clean now would delete to stay within retention (as the inventory listed them)."""
    return [d["entry"] for d in (inv or {}).get("retention") or []]


@dataclass(frozen=True)
class Writer:
    """The run that wrote a checkpoint folder's newest file; ``clone`` when another clone of the project
    started it (its experiment numbers are that clone's own)."""

    id: int
    clone: dict | None = None

    def __str__(self) -> str:
        if not self.clone:
            return f"experiment {self.id}"
        return (f"experiment {self.id} of another clone of this project "
                f"({self.clone.get('host', '?')}, {self.clone.get('path', '?')})")


def writer(runs: list[dict], inv: dict | None, mine: dict | None = None) -> Writer | None:
    """The run that wrote the checkpoint folder's newest file, as far as the target's run records tell: of the
    runs using the folder, the last one started before that file was written (and not ended before it)."""
    if not inv or not inv.get("files"):
        return None
    users = [r for r in runs if r.get("id") is not None and r.get("started")
             and str(r.get("checkpoints") or "").rstrip("/") == inv["path"].rstrip("/")]
    newest = inv.get("newest_mtime")
    during = [r for r in users if newest is not None
              and r["started"] - 2 <= newest <= (r.get("ended") or float("inf")) + 2]
    chosen = during or users
    if not chosen:
        return None
    run = max(chosen, key=lambda r: (r["started"], r["id"]))  # numbers of two clones do not compare
    other = run.get("clone") if mine is not None and run.get("clone") not in (None, mine) else None
    return Writer(run["id"], other)


def entry_label(writer: Writer | None, stopping: list, parent: int | None) -> str:
    """A launch's trash entry is named after the experiment whose checkpoints it holds: the folder's writer,
    else the newest run it stops, else the run it restarts."""
    owner = writer.id if writer is not None else (max(stopping) if stopping else parent)
    return f"exp{owner}" if owner is not None else "unknown"


# -- the ops ---------------------------------------------------------------------------------------------

def probe_ops(target: Target, settings: Settings, action: str) -> list[Op]:
    """Before anything changes: refuse an unsafe folder (or one a clean could not move), and what it holds
    (said before the run sees it; what retention would delete; for a purge every file, to delete only those).
    Their values are the probe's ``ckpt_safe`` and ``inventory``."""
    cleaning = action != "keep"
    return [Op("ckpt_check", {**folder(target), "busy_check": False, "movable": cleaning}),
            Op("ckpt_inventory", {**folder(target), **retention(settings), "full": action == "purge",
                                  "ignore": settings.checkpoints.ignore})]


def inventory_op(target: Target, settings: Settings | None = None, with_retention: bool = False,
                 path: str | None = None) -> Op:
    """What the folder (or ``path``) and its trash hold; with ``settings``, counted as ``[checkpoints] ignore``
    says, and with ``with_retention`` the entries a clean would delete. Bare, it lists the trash entries."""
    if settings is None:
        return Op("ckpt_inventory", folder(target, path))
    return Op("ckpt_inventory", {**folder(target, path), "ignore": settings.checkpoints.ignore,
                                 **(retention(settings) if with_retention else {})})


def check_op(target: Target, stopping: list) -> Op:
    """In the locked call, before a clean: the folder is safe to move once the runs ``stopping`` have stopped."""
    return Op("ckpt_check", {**folder(target), "stopping": stopping, "movable": True})


def trash_op(target: Target, settings: Settings, action: str, inv: dict | None, writer: Writer | None,
             stopping: list, parent: int | None, moved_by: int | None) -> Op:
    """A launch's ``--clean-checkpoints`` (``action`` "move") or ``--purge``, after the old run stopped: only
    the retention victims and (for a purge) the files the user confirmed from ``inv`` are deleted."""
    inv = inv or {}
    return Op("ckpt_trash", {**folder(target), "label": entry_label(writer, stopping, parent),
                             "moved_by": moved_by, "stopping": stopping, **retention(settings),
                             "purge": action == "purge", "purge_only": inv.get("all_files"),
                             "retention_allowed": doomed(inv)})


def clean_now_op(target: Target, settings: Settings, inv: dict, writer: Writer | None) -> Op:
    """``orch checkpoints clean``: the folder ``inv`` is of, into an entry named after the writer ("manual"
    when none is known), deleting only the retention victims ``inv`` listed (and the user confirmed)."""
    label = f"exp{writer.id}" if writer is not None else "manual"
    return Op("ckpt_trash", {**folder(target, inv["path"]), "label": label,
                             **retention(settings), "retention_allowed": doomed(inv)})


def move_op(target: Target) -> Op:
    """In a launch's locked call, after the runs it replaces stopped: an older orch's variant folders nested in
    the folder go where the variants' own folders are now (``agent/ckpt/ckpt_move``)."""
    return Op("ckpt_move", folder(target))


def variant_folder(target: Target, inv: dict | None, exp_id: int) -> str:
    """The checkpoint folder of a run beside the lineage (a sweep's variant, ``--beside``): where the target's
    inventory says the folder's variants go (``agent/ckpt/ckpt_layout``), else beside the folder."""
    start = (inv or {}).get("variant_prefix") or target.checkpoints.rstrip("/") + "@"
    return f"{start}exp{int(exp_id)}"


def own_folder(target: Target, exp_id: int, recorded: str | None) -> str | None:
    """``orch checkpoints ... -e ID``: the folder experiment ``exp_id`` wrote to, as its row records it (None:
    the lineage's folder); refused when that is not this target's folder or one of its experiments' own."""
    from .agent.ckpt import ckpt_layout

    conf = target.checkpoints.rstrip("/")
    path = (recorded or "").rstrip("/")
    if not path or path == conf:
        return None
    if ckpt_layout.is_variant_of(path, conf):
        return path
    if path == f"{conf}/exp{exp_id}":
        raise InputError(f"experiment {exp_id}'s checkpoints are in {path}, where an older orch put them (inside "
                         "the project's folder)",
                         hint=f"the next launch on {target.label} moves them beside it "
                              f"({variant_folder(target, None, exp_id)}); orch checkpoints list shows the folder")
    raise InputError(f"experiment {exp_id} wrote its checkpoints to {path}, not to {conf} or a folder beside it",
                     hint="name the target it ran on, or check [paths] checkpoints")


def lineage(exp: Experiment) -> str | None:
    """The lineage folder experiment ``exp`` ran in, from its record: the folder it wrote to, or for a run beside
    the lineage (a sweep's variant, ``--beside``, an older orch's nested folder) the folder it was beside.

    The folder it wrote to decides, not the configuration it recorded: an older orch's restart recorded its
    parent's configuration with today's folder, and ran in today's."""
    from .agent.ckpt import ckpt_layout

    path = (exp.checkpoints or "").rstrip("/")
    if not path:
        return None
    conf = _configured(exp)
    if conf and (ckpt_layout.is_variant_of(path, conf) or path == f"{conf}/exp{exp.id}"):
        return conf
    for mark in (f"@exp{exp.id}", f"/{ckpt_layout.VARIANTS}/exp{exp.id}"):
        if path.endswith(mark):
            return path[: -len(mark)]
    return path


def _configured(exp: Experiment) -> str | None:
    """The checkpoint folder ``exp``'s recorded configuration names (``{project}`` filled in), if it names one."""
    cfg = exp.config or {}
    spec = (cfg.get("targets") or {}).get(exp.target) or {}
    named = spec.get("checkpoints") or (cfg.get("paths") or {}).get("checkpoints")
    name = (cfg.get("project") or {}).get("name") or exp.project
    return str(named).replace("{project}", str(name)).rstrip("/") if named else None


def config_with(exp: Experiment, used: str) -> dict:
    """``exp``'s recorded configuration for a relaunch in the folder ``used``: as it is, or, where it names another
    folder (a restart by an older orch recorded its parent's with today's folder), naming ``used``, so that the
    new record's folder and its configuration agree."""
    conf = _configured(exp)
    if not exp.config or conf is None or conf == used.rstrip("/"):
        return exp.config
    import copy

    cfg = copy.deepcopy(exp.config)
    cfg.setdefault("paths", {})["checkpoints"] = used
    spec = (cfg.get("targets") or {}).get(exp.target)
    if isinstance(spec, dict) and spec.get("checkpoints"):
        spec["checkpoints"] = used
    return cfg


def ran_with(target: Target, exp: Experiment) -> Target:
    """``target`` as experiment ``exp`` ran on it: the root and checkpoint folder its record names, never today's
    orch.toml or defaults (a run launched with ``--set paths.checkpoints=...`` is restarted, cleaned, listed and
    pulled there). A record without them (a job's, an old one), or a target other than the one it ran on, leaves
    the target as it is."""
    from dataclasses import replace

    def place(machine: str | None) -> str:  # the machine key without the root it ends with (targets.machine_key)
        return (machine or "").rsplit(":", 1)[0]

    if exp.nodes or (exp.target != target.name and place(exp.machine) != place(target.machine)):
        return target
    cfg = exp.config or {}
    spec = (cfg.get("targets") or {}).get(exp.target) or {}
    root = spec.get("root") or (cfg.get("paths") or {}).get("root")
    changes: dict = {}
    folder_ = lineage(exp)
    if folder_ and folder_ != target.checkpoints.rstrip("/"):
        changes["checkpoints"] = folder_
    if root and str(root) != target.root:
        changes.update(root=str(root), machine=exp.machine or target.machine)
    return replace(target, **changes) if changes else target


def restore_op(target: Target, name: str, path: str | None = None) -> Op:
    return Op("ckpt_restore", {**folder(target, path), "name": name})


def purge_op(target: Target, names: list[str], path: str | None = None) -> Op:
    return Op("ckpt_purge", {**folder(target, path), "names": names})


def record(trash: dict | None) -> dict:
    """A launch's registry fields for what its ``ckpt_trash`` did (none when it did not run)."""
    return {"checkpoints_action": trash["action"], "checkpoints_entry": trash.get("entry_path")} if trash else {}


def moved(ops: list[Op], values: list | None) -> dict | None:
    """The ``ckpt_trash`` value among an agent call's answers (the ops that finished), if it ran."""
    return next((v for op, v in zip(ops, values or []) if op.name == "ckpt_trash"), None)


# -- what to say, and asking first -----------------------------------------------------------------------

def notice(inv: dict | None, writer: Writer | None) -> str | None:
    """A launch that keeps the checkpoints says what its run will see."""
    from .watch.metrics import format_size

    if not inv or not inv["files"]:
        return None
    by = f", written by {writer}" if writer is not None else ""
    return (f"checkpoints: {inv['path']} holds {inv['files']} file(s), {format_size(inv['bytes'])} "
            f"(newest {inv['newest']}{by}); the run will see them (--clean-checkpoints moves them aside)")


def confirm_launch(inv: dict, action: str, where: str, writer: Writer | None, *, yes: bool, confirm: Confirm,
                   echo: Callable[[str], None], guard: bool = False) -> None:
    """A launch's clean (``action`` "move" or "purge"; ``guard``: a guarded launch's) of ``inv`` on ``where``:
    said, then asked unless ``yes``; refused (InputError) without a way to ask, or when the answer is no, saying
    what was left and what to type instead. An empty folder asks nothing."""
    from .watch.metrics import format_size as size

    if not inv["files"]:
        return
    verb = "PERMANENTLY DELETE" if action == "purge" else "move to the trash"
    by = f", written by {writer}" if writer is not None else ""
    question = (f"{verb} {inv['files']} file(s), {size(inv['bytes'])} (newest {inv['newest']}{by}) "
                f"from {inv['path']} on {where}?")
    echo(f"checkpoints: {inv['files']} file(s), {size(inv['bytes'])} in {inv['path']} (newest {inv['newest']}{by})")
    victims = (inv.get("retention") or []) if action == "move" else []  # a purge leaves the trash alone
    if victims:
        names = ", ".join(f"{d['entry']} ({size(d['bytes'])})" for d in victims)
        echo(f"trash retention ([trash] keep / max_gb) will PERMANENTLY DELETE {len(victims)} older "
             f"trash entr{'y' if len(victims) == 1 else 'ies'}: {names}")
        question = question[:-1] + f", and PERMANENTLY DELETE trash entries {', '.join(doomed(inv))}?"
    if yes:
        return
    if confirm is None:
        raise InputError(f"refusing to {verb.lower()} checkpoints without confirmation",
                         hint="rerun with --yes to confirm, or in a terminal to be asked")
    if not confirm(question):
        flag = "--purge" if action == "purge" else "--guard" if guard else "--clean-checkpoints"
        keep = f"or without {flag} to keep them (the new run resumes from them)"
        if action == "purge":
            keep = "--clean-checkpoints instead of --purge to move them to the trash (restorable), " + keep
        elif guard:
            keep = "or without --guard, which moves them aside to put them back if the new run is worse"
        act = "delete them for good" if action == "purge" else "move them to the trash"
        raise cancelled(f"nothing was changed on {where}; the {inv['files']} checkpoint file(s) in {inv['path']} "
                        "are where they were", f"rerun with --yes to {act} without being asked, {keep}")


def _ask(yes: bool, confirm: Confirm, question: str, left: str) -> None:
    if yes:
        return
    if confirm is None:
        raise InputError("refusing without confirmation", hint="rerun with --yes, or in a terminal to be asked")
    if not confirm(question):
        raise cancelled(left, "rerun with --yes to go on without being asked; orch checkpoints list shows what "
                              "the folder and its trash hold")


def _entries(n: int) -> str:
    return f"entr{'y' if n == 1 else 'ies'}"


# -- putting back ----------------------------------------------------------------------------------------

class PutBack(NamedTuple):
    said: str  # the sentence for the launch's error or interruption line
    fields: dict  # the launch's registry fields: restored, or where the checkpoints still are


def put_back(target: Target, settings: Settings, name: str, path: str, *, what: str,
             client: AgentClient | None = None, moved: int | None = None, action: str = "moved") -> PutBack:
    """Move a failed launch's trash entry ``name`` (at ``path``) back into the folder (``ckpt_restore`` never
    overwrites); ``moved``: how many files it holds, when known.

    Through ``client``, or a connection of its own when the launch's is gone. When it cannot, the sentence
    says where they are and the command that puts them back, and the fields keep ``action`` with ``path``.
    """
    try:
        if client is not None:
            client.call([restore_op(target, name)], lock=settings.run.lock_timeout, what=what)
        else:
            assert target.connect is not None
            with target.connect() as transport:
                AgentClient(transport, target.root, target.python, timeout=settings.ssh.command_timeout).call(
                    [restore_op(target, name)], lock=settings.run.lock_timeout, what=what)
    except OrchError as exc:
        return PutBack(f"the checkpoints it moved aside are in {path} on {target.label} (putting them back "
                       f"failed: {exc.message}); orch checkpoints restore {name} puts them back",
                       {"checkpoints_action": action, "checkpoints_entry": path})
    files = f"the {moved} checkpoint file(s)" if moved is not None else "the checkpoints"
    return PutBack(f"{files} it moved aside were put back in {target.checkpoints}", dict(RESTORED))


# -- orch checkpoints list | clean | restore | purge -----------------------------------------------------

class _Session:
    """One connection to the target for the whole command: read the folder, then change it under the lock."""

    def __init__(self, settings: Settings, target: Target, open_registry: OpenRegistry,
                 read_only: bool = False) -> None:
        from .records.reconcile import client_for

        self.settings, self.target, self.open_registry = settings, target, open_registry
        self.client = client_for(settings, target, read_only=read_only)

    def reconcile(self, *also: Op) -> list:
        """The registry's unsettled rows brought up to date, in one agent call with the ops ``also``."""
        from .records.reconcile import reconcile

        with self.open_registry() as reg:
            return reconcile(self.settings, self.target, reg, self.client, also=list(also))

    def change(self, op: Op) -> dict:
        return self.client.call([op], lock=self.settings.run.lock_timeout, what=f"checkpoints {op.name}")[0]

    def __enter__(self) -> "_Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.transport.close()


def listing(settings: Settings, target: Target, open_registry: OpenRegistry, path: str | None = None) -> dict:
    """``orch checkpoints list``: what the folder (or an experiment's own, ``path``) and its trash hold
    (read-only), with ``target_label``."""
    with _Session(settings, target, open_registry, read_only=True) as s:
        inv = s.reconcile(inventory_op(target, settings, path=path))[0]
    return {**inv, "target_label": target.label}


def clean(settings: Settings, target: Target, open_registry: OpenRegistry, *, yes: bool, confirm: Confirm,
          warn: Callable[[str], None], path: str | None = None) -> dict:
    """``orch checkpoints clean``: move the folder's contents into a trash entry named after their writer,
    deleting only the retention victims that were named (``warn``) and confirmed. Refused while a run writes
    to the folder. The agent's answer with ``path``; ``action`` "kept" when there was nothing to move."""
    from .watch.metrics import format_size as size

    with _Session(settings, target, open_registry) as s:
        inv = s.reconcile(inventory_op(target, settings, with_retention=True, path=path))[0]
        if not inv["files"]:
            return {"action": "kept", "moved": 0, "path": inv["path"]}
        victims = doomed(inv)
        if victims:
            warn(f"trash retention ([trash] keep / max_gb) will PERMANENTLY DELETE {', '.join(victims)}")
        _ask(yes, confirm, f"move {inv['files']} file(s), {size(inv['bytes'])}, from {inv['path']} to the trash"
                           + (f" and delete {len(victims)} older trash {_entries(len(victims))}?" if victims else "?"),
             f"nothing was moved; the {inv['files']} file(s) in {inv['path']} are where they were")
        runs = s.client.one("status", project=settings.project.name, tail=False, gpus=False)["runs"]
        res = s.change(clean_now_op(target, settings, inv, writer(runs, inv)))
    return {"path": inv["path"], **res}


def restore(settings: Settings, target: Target, open_registry: OpenRegistry, name: str,
            path: str | None = None) -> dict:
    """``orch checkpoints restore NAME``: the entry's files back into the folder (never overwrites)."""
    with _Session(settings, target, open_registry) as s:
        s.reconcile()
        return s.change(restore_op(target, name, path))


def purge(settings: Settings, target: Target, open_registry: OpenRegistry, names: list[str], *, every: bool,
          yes: bool, confirm: Confirm, path: str | None = None) -> dict:
    """``orch checkpoints purge``: delete the trash entries ``names`` (or ``every`` one) for good, once confirmed."""
    from .watch.metrics import format_size as size

    with _Session(settings, target, open_registry) as s:
        inv = s.reconcile(inventory_op(target, settings, path=path))[0]
        names = [e["name"] for e in inv["entries"]] if every else list(names)
        if not names:
            raise InputError("name the trash entries to delete, or pass --all", hint="see orch checkpoints list")
        total = sum(e["bytes"] for e in inv["entries"] if e["name"] in names)
        _ask(yes, confirm, f"PERMANENTLY delete {len(names)} trash {_entries(len(names))} ({size(total)})?",
             f"nothing was deleted; the trash holds {', '.join(names)} as before")
        return s.change(purge_op(target, names, path))

