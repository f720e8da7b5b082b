"""One agent call: read a request on stdin, run its ops in order, print one envelope."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping

from . import diskspace, journal
from .machine import identity
from .run import launch_env
from .serving import validate
from .store.blob_stream import Payload
from .layout import Layout
from .lock import TargetLock
from .protocol import PROTOCOL, AgentFailure, frame


def _shell(layout: Layout, argv: list, cwd: str | None = None, timeout: float = 600, check: bool = True,
           run: dict | None = None) -> dict:
    """A playbook's shell step; with ``run``, in that new run's work folder (made now, kept for its start)."""
    import subprocess

    from .run import workdir

    if not argv or not all(isinstance(a, str) for a in argv):
        raise AgentFailure("input", "a shell step needs argv: a list of strings")
    env = None
    if run is not None:
        cwd = workdir.for_step(layout, run["exp_id"], run["registry"], run["revision"])
        env = {**launch_env.original(), "ORCH_EXPERIMENT_ID": str(run["exp_id"]), "ORCH_RUN_DIR": os.path.dirname(cwd),
               "ORCH_WORK_DIR": cwd}
    try:
        proc = subprocess.run(argv, cwd=cwd or layout.root, env=env, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        if not check:  # an optional step (e.g. nvidia-smi on a CT without a GPU) must not block a launch
            return {"exit_code": None, "stdout": "", "stderr": "", "skipped": f"{argv[0]!r} is not installed"}
        raise AgentFailure("input", f"{argv[0]!r} is not installed on the target",
                           "install it there, or mark the step check: false in the playbook") from None
    except subprocess.TimeoutExpired:
        raise AgentFailure("agent", f"{argv[0]} did not finish within {timeout:g} s") from None
    out = {"exit_code": proc.returncode, "stdout": proc.stdout.decode("utf-8", "replace")[-4000:],
           "stderr": proc.stderr.decode("utf-8", "replace")[-4000:]}
    if check and proc.returncode != 0:
        raise AgentFailure("agent", f"{argv[0]} exited with {proc.returncode}: {out['stderr'].strip()[-300:]}",
                           "fix the step or mark it check: false in the playbook")
    return out


def _hello(layout: Layout) -> dict:
    return {"protocol": PROTOCOL, "python": ".".join(map(str, sys.version_info[:3])),
            "agent": os.path.abspath(sys.argv[0])}


def _status(layout: Layout, gpus: bool = True, **args: object) -> dict:
    """``status``, once any rollback that was cut short is on its way again (``rollback.resume_pending``), with the
    target's GPUs and the project's queue."""
    from .machine import system
    from .queue import runqueue
    from .run import rollback, runs

    rollback.resume_pending(layout)
    return {**runs.status(layout, **args), "gpus": system.gpus() if gpus else [],  # type: ignore[arg-type]
            "queue": runqueue.entries(layout, args["project"]) if args.get("project") else []}


def _run_start(layout: Layout, **args: object) -> dict:
    from .run import runs

    return runs.start(layout, agent_path=os.path.abspath(sys.argv[0]), **args)  # type: ignore[arg-type]


def _slurm_check(layout: Layout, exp_id: int, registry: str | None, **args: object) -> dict:
    from .run import slurm

    return slurm.check(layout, layout.run_dir(exp_id, registry), args)


# op name -> (its function: one of this module's, or "<module>.<function>" under the agent; whether it takes the
# payload); every function takes the layout first. A call is a process of its own and runs an op or two: it imports
# only their modules (``OPS``). The layer test reads the names here as the imports they stand for.
OP_TABLE: dict[str, tuple[Callable[..., object] | str, bool]] = {
    "hello": (_hello, False),
    "preflight": ("machine.system.preflight", False),
    "net_route": ("machine.system.net_route", False),
    "blobs_missing": ("store.revisions.blobs_missing", False),
    "blobs_store": ("store.revisions.blobs_store", True),
    "revision_assemble": ("store.revisions.revision_assemble", False),
    "run_start": (_run_start, False),
    "run_check": ("run.start_check.check", False),
    "slurm_check": (_slurm_check, False),
    "run_stop": ("run.runs.stop", False),
    "slurm_nodes": ("run.slurm.nodes", False),
    "slurm_doctor": ("run.slurm.doctor", False),
    "run_verify": ("run.runs.verify_started", False),
    "status": (_status, False),
    "gpus": ("machine.system.gpu_report", False),
    "gpu_share": ("queue.gpu_share.share", False),
    "queue_add": ("queue.runqueue.add", False),
    "queue_list": ("queue.runqueue.listing", False),
    "queue_remove": ("queue.runqueue.remove", False),
    "sweep_start": ("queue.search.start", False),
    "sweep_read": ("queue.search.read", False),
    "sweep_stop": ("queue.search.stop", False),
    "run_records": ("run.runs.records", False),
    "log_read": ("serving.logs.read", False),
    "log_stream": ("serving.logs.stream", False),
    "ckpt_check": ("ckpt.checkpoints.check", False),
    "ckpt_inventory": ("ckpt.checkpoints.inventory", False),
    "ckpt_trash": ("ckpt.checkpoints.move_to_trash", False),
    "ckpt_restore": ("ckpt.checkpoints.restore", False),
    "ckpt_purge": ("ckpt.checkpoints.purge", False),
    "ckpt_move": ("ckpt.ckpt_move.move", False),  # in a locked call only
    "shell": (_shell, False),
    "gc": ("store.gc.gc", False),
    "journal_read": ("journal.read_many", False),
    "notify_test": ("watch.notify.test", False),
    "env_probe": ("store.envs.probe", False),
    "env_index": ("store.envs.index_reachable", False),
    "env_build": ("store.envs.build", False),
    "env_use": ("store.envs.use", False),
    "env_list": ("store.envs.listing", False),
    "files_manifest": ("serving.run_files.manifest", False),
    "files_send": ("serving.run_files.send", False),
    "doctor": ("machine.doctor.facts", False),
}


class _Ops(Mapping):
    """``OP_TABLE`` with each function imported as it is looked up: ``OPS[op]`` -> (function, takes the payload)."""

    def __getitem__(self, op: str) -> tuple[Callable[..., object], bool]:
        where, wants_payload = OP_TABLE[op]
        if isinstance(where, str):
            module, name = where.rsplit(".", 1)
            where = getattr(importlib.import_module(f"{__package__}.{module}"), name)
        return where, wants_payload

    def __iter__(self) -> Iterator[str]:
        return iter(OP_TABLE)

    def __len__(self) -> int:
        return len(OP_TABLE)


OPS = _Ops()


def controller_gone() -> bool:
    """True once the controller stopped listening (Ctrl-C, a dropped link): our stdout has no reader."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


# ops that change what runs or where checkpoints are: none starts once the controller is gone. Storing
# blobs and assembling a revision still finish, so a push cut midway resumes with only what is missing.
# Once a run_stop has stopped a run, though, the rest of the plan (its start) runs to its end whoever listens:
# a launch cut there would leave neither the old run nor the new one (``committed``).
STOP_BEFORE = ("run_stop", "run_start", "queue_add", "queue_remove", "ckpt_trash", "ckpt_restore", "ckpt_purge",
               "ckpt_move", "shell", "gc")
CANCELLED = {"kind": "cancelled", "message": "the controller went away: the remaining steps were not run",
             "hint": ""}


def committed(op: str | None, result: dict) -> bool:
    """Whether this op's result passes the launch's point of no return: an old run was stopped."""
    return op == "run_stop" and result.get("ok") and bool((result.get("value") or {}).get("stopped"))


def _dispatch(layout: Layout, op: str, args: dict, payload: Payload) -> object:
    if op not in OP_TABLE:
        raise AgentFailure("input", f"unknown agent operation {op!r}", "the controller and agent versions differ")
    func, wants_payload = OPS[op]
    validate.op_args(op, args)
    return func(layout, payload, **args) if wants_payload else func(layout, **args)


def _unexpected(op: str, exc: Exception) -> dict:
    """An exception no op expects: one line for the user, the traceback as evidence."""
    import traceback

    line = f"{exc!r}".replace("\n", " ")[:300]
    return {"kind": "agent", "message": f"agent failure in {op}: {line}",
            "hint": "rerun with --verbose to see the agent's traceback, and report it",
            "traceback": traceback.format_exc()[-6000:]}


def _save_evidence(layout: Layout, args: dict, error: dict) -> None:
    """An unexpected failure of an op about one run: its traceback goes into that run's folder too."""
    if not isinstance(args.get("exp_id"), int):
        return
    run_dir = layout.run_dir(args["exp_id"], args.get("registry"))
    if os.path.isdir(run_dir):
        try:
            with open(os.path.join(run_dir, "agent-failure.txt"), "a") as fh:
                fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {error['message']}\n{error['traceback']}\n")
        except OSError:
            pass  # the envelope still carries it


def _run_one(layout: Layout, item: dict, payload: Payload) -> dict:
    """One op's result: its value, or its failure as one clean error."""
    started = time.monotonic()
    try:
        value = _dispatch(layout, item["op"], item.get("args", {}), payload)
    except AgentFailure as exc:
        return {"ok": False, "error": exc.to_dict()}
    except TypeError as exc:
        return {"ok": False, "error": {"kind": "input", "hint": "",
                                       "message": f"bad arguments for {item['op']}: {exc}"}}
    except OSError as exc:
        if diskspace.is_full(exc):
            return {"ok": False, "error": diskspace.full_failure(exc, item["op"], layout.root).to_dict()}
        return {"ok": False, "error": {"kind": "agent", "hint": "check permissions and disk space",
                                       "message": f"{item['op']}: {exc}"}}
    except Exception as exc:  # a bug: keep the evidence and what the earlier ops did
        error = _unexpected(item["op"], exc)
        _save_evidence(layout, item.get("args") or {}, error)
        return {"ok": False, "error": error}
    return {"ok": True, "value": value, "ms": round((time.monotonic() - started) * 1000, 1)}


def _journal(layout: Layout, request: dict) -> journal.Journal | None:
    """The journal of a locked launch (``"journal": {"exp_id", "registry", "project"}`` in the request)."""
    spec = request.get("journal")
    if not spec or request.get("lock") is None:
        return None
    return journal.Journal(layout.run_dir(spec["exp_id"], spec.get("registry")))


def handle(request: dict, payload: Payload, results: list | None = None) -> dict:
    """Run the request's ops; ``results`` (given by the caller) keeps what was done if this raises."""
    if request.get("v") != PROTOCOL:
        raise AgentFailure("agent", f"protocol {request.get('v')} is not this agent's ({PROTOCOL})")
    layout = Layout(request.get("root", ""))
    results = [] if results is None else results
    who, why = identity.check(layout.root, request.get("expect"))  # before the lock and every op: touch nothing
    if why is not None:
        expect = request["expect"]
        return {"v": PROTOCOL, "results": [], "who": who,
                "fatal": {"kind": "identity", "hint": "", "message": f"the machine answering is not CT "
                          f"{expect.get('vmid')} ({expect.get('hostname')}): {why}"}}
    ops = request.get("ops", [])
    steps = _journal(layout, request)

    def run_all() -> None:
        if steps is not None:
            spec = request["journal"]
            steps.begin(request.get("what") or "operation", [item["op"] for item in ops],
                        exp_id=spec["exp_id"], registry=spec.get("registry"), project=spec.get("project"))
        past_return = False  # an old run was stopped: the new one starts whoever listens
        for item in ops:
            if item.get("op") in STOP_BEFORE and not past_return and controller_gone():  # the step in progress only
                result: dict = {"ok": False, "error": CANCELLED}
            else:
                result = _run_one(layout, item, payload)
            past_return = past_return or committed(item.get("op"), result)
            results.append(result)
            if steps is not None:  # on the target's disk before the next step starts
                steps.step(item["op"], result)
            if not result["ok"]:
                break
        if steps is not None:
            steps.end()

    if request.get("lock") is not None:
        try:
            layout.ensure()
        except OSError as exc:
            if diskspace.is_full(exc):
                raise diskspace.full_failure(exc, "preparing the target's root", layout.root) from None
            raise
        with TargetLock(layout.lock, float(request["lock"]), request.get("what", "operation"), controller_gone):
            diskspace.clean_stale([layout.blobs, layout.revisions, layout.runs])
            run_all()
    else:
        run_all()
    return {"v": PROTOCOL, "results": results} | ({"who": who} if who is not None else {})


def read_request(line: bytes) -> object:
    """The request line as JSON, or a clean input failure (never a traceback)."""
    try:
        return json.loads(line or b"{}")
    except (ValueError, RecursionError) as exc:
        raise AgentFailure("input", f"the request is not JSON: {str(exc)[:200]}",
                           "the agent reads one JSON object on its first line of stdin") from None


def respond(stdin) -> bytes:
    """Read one request (its JSON line and its payload) from ``stdin``, run it, and return the envelope."""
    results: list = []
    payload = None
    try:
        request = validate.request(read_request(stdin.readline()))
        payload = Payload(stdin, validate.payload_size(request))  # read by the op that takes it, piece by piece
        response = handle(request, payload, results)
    except AgentFailure as exc:
        response = {"v": PROTOCOL, "fatal": exc.to_dict(), "results": results}
    except Exception as exc:  # the envelope must always come back, with what went wrong and what was done
        response = {"v": PROTOCOL, "fatal": _unexpected("the agent", exc), "results": results}
    if payload is not None:
        payload.skip(payload.left)  # what no op read: the next request starts after it
    return frame(response)


def main() -> int:
    launch_env.remember()  # the target's environment, before the agent's own locale: what runs start with
    os.environ["LC_ALL"] = "C.UTF-8"  # tmux, and the text the agent reads back from it, in a UTF-8 locale
    os.environ.pop("LANGUAGE", None)
    sys.stdout.buffer.write(respond(sys.stdin.buffer))
    sys.stdout.buffer.flush()
    return 0
