"""What the agent accepts on the wire: every request field and op argument is checked here first.

The controller is trusted to send well-formed requests, but the agent never relies on it: a blob name
becomes a file name, a manifest path a place to link into, an id a run folder. Anything else is an
``AgentFailure("input", ...)`` before an op touches the disk.

    request({"v": 1, "root": "/r", "ops": [{"op": "hello", "args": {}}], "payload": 0})   # ok
    manifest([{"path": "a", ...}, {"path": "a/b", ...}])   # refused: "a" is a file and a folder
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from ..protocol import AgentFailure

SHA = re.compile(r"[0-9a-f]{64}")
KEY = re.compile(r"[0-9a-f]{1,64}")
REVISION = re.compile(r"[0-9a-f]{16}")
MODES = (0o644, 0o755)  # what the controller's manifest records: executable or not
RESERVED = (".orch-manifest.json",)  # written by revision_assemble beside the files
MAX_ID = 1 << 62
MAX_ARGS = 1 << 16
ARG_CHARS = 4096  # one string on the wire: an argv word, a path, an env name
ENV_VALUE_CHARS = 1 << 20
STUDY_CHARS = 64 << 20  # a sweep's study file, base64: a few hundred KB for a few hundred trials
# what Linux's execve takes: one argv or NAME=value string (MAX_ARG_STRLEN, with its NUL), and all of them
# together, pointers included; the budget leaves half of the usual 2 MiB ARG_MAX to the target's own environment
EXEC_STRING_BYTES = 32 * 4096
EXEC_TOTAL_BYTES = 1 << 20
# the variables the agent adds to every run's environment, with room for its paths (runs/<id>/, the agent)
RUN_ENV_ALLOWANCE = 8192


WIRE_HINT = ("the controller and agent disagree on the wire format: update orch on the controller "
             "(the agent is pushed by it)")


def fail(message: str, hint: str = WIRE_HINT) -> AgentFailure:
    return AgentFailure("input", message, hint)


def _int(value: Any, name: str, low: int = 0, high: int = MAX_ID) -> int:
    if type(value) is not int or not low <= value <= high:
        raise fail(f"{name} must be an integer in [{low}, {high}], not {value!r:.80}")
    return value


def _num(value: Any, name: str) -> float:
    if type(value) not in (int, float) or not 0 <= value <= 1e9:
        raise fail(f"{name} must be a non-negative number, not {value!r:.80}")
    return float(value)


def _str(value: Any, name: str, limit: int = ARG_CHARS) -> str:
    if not isinstance(value, str) or len(value) > limit or "\0" in value:
        raise fail(f"{name} must be a string without NUL of at most {limit} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise fail(f"{name} is not valid UTF-8") from None
    return value


def _list(value: Any, name: str, each: Callable[[Any, str], Any]) -> list:
    if not isinstance(value, list) or len(value) > MAX_ARGS:
        raise fail(f"{name} must be a list of at most {MAX_ARGS} items")
    return [each(v, f"{name}[{i}]") for i, v in enumerate(value)]


def _dict(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise fail(f"{name} must be an object")
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise fail(f"{name} must be true or false")
    return value


def _optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    return lambda value, name: None if value is None else check(value, name)


def sha(value: Any, name: str = "blob name") -> str:
    """A blob name: exactly 64 lowercase hex digits (it becomes a file name under blobs/)."""
    if not isinstance(value, str) or not SHA.fullmatch(value):
        raise fail(f"{name} {value!r:.80} is not a sha256 (64 lowercase hex digits)")
    return value


def revision(value: Any, name: str = "revision") -> str:
    if not isinstance(value, str) or not REVISION.fullmatch(value):
        raise fail(f"{name} {value!r:.80} is not a revision id (16 lowercase hex digits)")
    return value


def project(value: Any, name: str = "project") -> str:
    """A project name, as config.py allows it: it names a tmux session and is compared, never joined."""
    if not isinstance(value, str) or not value or len(value) > 128 \
            or not all(c.isalnum() or c in "-_" for c in value):
        raise fail(f"{name} {value!r:.80} must be letters, digits, '-' or '_'")
    return value


def exp_id(value: Any, name: str = "exp_id") -> int:
    return _int(value, name)


def name_part(value: Any, name: str = "name") -> str:
    """One file name orch makes or looks up (a trash entry, its label): no '/', never '.' or '..'."""
    if not isinstance(value, str) or not 0 < len(value) <= 200 or value in (".", "..") \
            or not all(c.isalnum() or c in "-_.:" for c in value):
        raise fail(f"{name} {value!r:.80} is not a plain file name")
    return value


def trash_name(value: Any, name: str = "name") -> str:
    """A trash entry name the user typed: the same rule, said in the user's words."""
    try:
        return name_part(value, name)
    except AgentFailure:
        raise fail(f"{value!r:.80} is not a trash entry name", "see orch checkpoints list") from None


def env_name(value: Any, name: str) -> str:
    """An environment variable's name as execve takes it: not empty, no '=' (nor NUL)."""
    _str(value, name)
    if not value or "=" in value:
        raise fail(f"{name} {value!r:.80} is not an environment variable name (empty, or with '=')")
    return value


def _env(value: Any, name: str) -> dict:
    for key, item in _dict(value, name).items():
        env_name(key, f"{name} name")
        _str(item if type(item) is not int and type(item) is not float else str(item), f"{name}[{key}]",
             ENV_VALUE_CHARS)
    return value


def _launch(value: Any, name: str) -> dict:
    """What a run inherits from the command that launched it (``launch_env``): variables, umask, limits."""
    from ..run.launch_env import check

    try:
        found = check(value, name)
    except AgentFailure as exc:
        raise fail(exc.message) from None
    for key, text in found["env"].items():
        _str(text, f"{name}.env[{key}]", ENV_VALUE_CHARS)
    return found


def exec_size(argv: list, env: dict) -> tuple[int, str | None]:
    """The bytes execve needs for ``argv`` and ``env`` (with RUN_ENV_ALLOWANCE for the agent's own variables),
    and the first string that is over EXEC_STRING_BYTES on its own (``argv[2]``, ``env[NAME]``), if any."""
    total, over = RUN_ENV_ALLOWANCE, None
    for where, text in [*((f"argv[{i}]", a) for i, a in enumerate(argv)),
                        *((f"env[{k}]", f"{k}={v}") for k, v in env.items())]:
        size = len(str(text).encode("utf-8", "surrogateescape")) + 1
        total += size + 8
        if over is None and size > EXEC_STRING_BYTES:
            over = where
    return total, over


def _exec_fits(argv: Any, env: Any, name: str) -> None:
    total, over = exec_size(argv, env)
    if over is not None:
        raise fail(f"{name}.{over} is over {EXEC_STRING_BYTES} bytes: more than one string the kernel execs")
    if total > EXEC_TOTAL_BYTES:
        raise fail(f"{name}'s command and environment are {total} bytes; at most {EXEC_TOTAL_BYTES} can be exec'd")


def rel_path(value: Any, name: str = "path") -> str:
    """A manifest path: relative, normalized, no empty, '.' or '..' parts, each part a valid file name."""
    path = _str(value, name)
    parts = path.split("/")
    if not path or path.startswith("/") or os.path.normpath(path) != path \
            or any(p in ("", ".", "..") for p in parts):
        raise fail(f"manifest path {path!r:.200} escapes the revision folder or is not normalized")
    if any(len(p.encode()) > 255 for p in parts) or path in RESERVED:
        raise fail(f"manifest path {path!r:.200} is not a file name orch can write")
    return path


def key(value: Any, name: str = "key") -> str:
    """A pending file's key: 1-64 lowercase hex digits (it names a part file under blobs/)."""
    if not isinstance(value, str) or not KEY.fullmatch(value):
        raise fail(f"{name} {value!r:.80} is not a key (1-64 lowercase hex digits)")
    return value


def blobs(value: Any, name: str = "blobs") -> list:
    """``blobs_store``'s list: [{"sha256", "size", "offset"}] or [{"key", "size", "offset"}] (the hash after
    the bytes), 0 <= offset <= size."""
    def entry(item: Any, where: str) -> dict:
        item = _dict(item, where)
        if "key" in item and item.get("sha256") is None:
            key(item["key"], f"{where}.key")
        else:
            sha(item.get("sha256"), f"{where}.sha256")
        size = _int(item.get("size"), f"{where}.size", 0, 1 << 40)
        if item.get("offset") is not None:
            _int(item["offset"], f"{where}.offset", 0, size)
        return item
    return _list(value, name, entry)


def manifest(files: Any, name: str = "files") -> list:
    """A revision's files: valid blob names and modes, no duplicate path, no file that is also a folder."""
    def entry(item: Any, where: str) -> dict:
        item = _dict(item, where)
        rel_path(item.get("path"), f"{where}.path")
        sha(item.get("sha256"), f"{where}.sha256")
        if type(item.get("mode")) is not int or item["mode"] not in MODES:
            raise fail(f"{where}.mode {item.get('mode')!r:.40} is not one of {', '.join(map(oct, MODES))}")
        if "size" in item:
            _int(item["size"], f"{where}.size", 0, 1 << 40)
        return item
    checked = _list(files, name, entry)
    paths = [f["path"] for f in checked]
    seen = set(paths)
    if len(seen) != len(paths):
        dup = next(p for i, p in enumerate(paths) if p in paths[:i])
        raise fail(f"manifest path {dup!r:.200} appears more than once")
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise fail(f"manifest path {'/'.join(parts[:i])!r:.200} is both a file and the folder of {path!r:.200}")
    return checked


_EXP_IDS = _optional(lambda v, n: _list(v, n, exp_id))


def registry_id(value: Any, name: str = "registry") -> str | None:
    """A registry's id (12 hex digits), part of its runs' folder names; None for runs from before keys."""
    if value is not None and not (isinstance(value, str) and len(value) == 12
                                  and all(c in "0123456789abcdef" for c in value)):
        raise fail(f"{name} must be 12 lowercase hex digits, not {value!r:.80}")
    return value


_STRINGS = lambda v, n: _list(v, n, _str)  # noqa: E731


def run_of(value: Any, name: str = "run") -> dict:
    """The new run a shell step works for: ``{"exp_id", "registry", "revision"}`` (its work folder's makings)."""
    _dict(value, name)
    if set(value) != {"exp_id", "registry", "revision"}:
        raise fail(f"{name} must name exactly exp_id, registry and revision")
    exp_id(value["exp_id"], f"{name}.exp_id")
    registry_id(value["registry"], f"{name}.registry")
    revision(value["revision"], f"{name}.revision")
    return value

_ANY_DICT = _dict


def env_hash(value: Any, name: str = "hash") -> str:
    if not isinstance(value, str) or not REVISION.fullmatch(value):
        raise fail(f"{name} must be 16 lowercase hex digits")
    return value


def _choice(value: Any, name: str, allowed: tuple) -> str:
    if value not in allowed:
        raise fail(f"{name} must be one of {', '.join(allowed)}")
    return value


def wheels(value: Any, name: str = "wheels") -> list:
    """Pushed wheels: ``[{"name": "attrs-23.2.0-py3-none-any.whl", "sha256": ...}]``, plain file names."""
    def entry(item: Any, where: str) -> dict:
        _dict(item, where)
        if set(item) != {"name", "sha256"}:
            raise fail(f"{where} must name exactly name and sha256")
        sha(item["sha256"], f"{where}.sha256")
        file = _str(item["name"], f"{where}.name", 255)
        if "/" in file or file.startswith(".") or "\0" in file:
            raise fail(f"{where}.name must be a plain file name")
        return item
    return _list(value, name, entry)

def pull_key(value: Any, name: str = "key") -> str:
    """A file a pull asks for: ``train.log``, or ``checkpoints/<rel>`` / ``outputs/<rel>`` with a manifest path."""
    key = _str(value, name)
    if key == "train.log":
        return key
    source, _, rel = key.partition("/")
    if source not in ("checkpoints", "outputs"):
        raise fail(f"{name} {key!r:.200} is not under checkpoints/, outputs/ or train.log")
    try:
        rel_path(rel, name)
    except AgentFailure:
        raise fail(f"{name} {key!r:.200} is not a plain path inside its folder (no '..', '.' or empty part)") \
            from None
    return key


def pull_glob(value: Any, name: str = "glob") -> str:
    """A pattern over the files' paths: relative, no '..' part (it would only ever match nothing or escape)."""
    pattern = _str(value, name, 1024)
    if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
        raise fail(f"{name} {pattern!r:.200} must be a relative pattern without '..'",
                   "e.g. '*.pt' or 'out/*.json'")
    return pattern


def _pull_files(value: Any, name: str) -> list:
    def entry(item: Any, where: str) -> dict:
        item = _dict(item, where)
        pull_key(item.get("key"), f"{where}.key")
        _int(item.get("offset", 0), f"{where}.offset", 0, 1 << 42)
        return item
    return _list(value, name, entry)


_PULL_FROM = {"exp_id": exp_id, "registry": registry_id, "checkpoints": _optional(_str),
              "entry": _optional(trash_name), "outputs": _bool, "log": _bool, "own": _bool}

def _torchrun(value: Any, name: str) -> dict:
    """A job over several nodes' launcher lines (``launch/slurm.launcher``): one per rank, with its places."""
    value = _dict(value, name)
    for key in ("argv", "env", "places", "python", "port"):
        if key not in value:
            raise AgentFailure("input", f"{name}: {key} is missing", "the controller and agent versions differ")
    _list(value["argv"], f"{name}.argv", _STRINGS)
    _env(value["env"], f"{name}.env")
    _STRINGS(value["places"], f"{name}.places")
    _str(value["python"], f"{name}.python")
    _int(value["port"], f"{name}.port", 1, 65535)
    if len(value["argv"]) != len(value["places"]):
        raise AgentFailure("input", f"{name}: one line per node", "the controller and agent versions differ")
    return value


def _slurm_job(value: Any, name: str) -> dict:
    """A run's Slurm options (``slurm.sbatch_argv``): the same keys as ``slurm_check``'s."""
    value = _dict(value, name)
    for key, check in ARGS["slurm_check"].items():
        if key in value and key not in ("exp_id", "registry"):
            check(value[key], f"{name}.{key}")
    return value


# op -> {argument: check}; an argument not named here is refused (the op would fail on it anyway)
ARGS: dict[str, dict[str, Callable[[Any, str], Any]]] = {
    "hello": {},
    "preflight": {"min_free_mb": lambda v, n: _int(v, n, 0, 1 << 30)},
    "blobs_missing": {"hashes": lambda v, n: _list(v, n, sha), "keys": lambda v, n: _list(v, n, key),
                      "sizes": lambda v, n: _list(v, n, lambda s, m: _int(s, m, 0, 1 << 40))},
    "blobs_store": {"blobs": blobs},
    "revision_assemble": {"revision": revision, "files": _optional(manifest)},
    "run_start": {"exp_id": exp_id, "registry": registry_id, "project": project, "revision": revision,
                  "argv": _STRINGS, "env": _env,
                  "experiment": _ANY_DICT, "batching": _ANY_DICT, "recovery": _optional(_dict),
                  "notify": _optional(_dict), "launch": _optional(_launch), "use_standby": _bool,
                  "slurm_job": _optional(_slurm_job)},
    "slurm_check": {"exp_id": exp_id, "registry": registry_id, "name": _str, "partition": _optional(_str),
                    "account": _optional(_str), "qos": _optional(_str), "time": _optional(_str),
                    "gpus": _optional(_int), "nodes": _optional(_int), "signal": _optional(_str),
                    "sbatch_args": _optional(_STRINGS), "resubmit": _optional(_bool),
                    "torchrun": _optional(_torchrun)},
    "queue_add": {"exp_id": exp_id, "registry": registry_id, "project": project, "revision": revision,
                  "argv": _STRINGS, "env": _env,
                  "experiment": _ANY_DICT, "batching": _ANY_DICT, "recovery": _optional(_dict), "start_idle": _bool,
                  "launch": _optional(_launch), "use_standby": _bool},
    "queue_list": {"project": project, "start_stale": _bool},
    "sweep_start": {"project": project, "sweep": name_part, "spec": _optional(_dict),
                    "study": _optional(lambda v, n: _str(v, n, STUDY_CHARS))},
    "sweep_read": {"project": project, "sweep": name_part},
    "sweep_stop": {"project": project, "sweep": name_part},
    "queue_remove": {"project": project, "ids": _EXP_IDS, "registry": registry_id, "sweep": _optional(_str)},
    "run_check": {"exp_id": exp_id, "registry": registry_id, "project": project, "revision": revision,
                  "secrets": _optional(_STRINGS), "checkpoints": _optional(_str), "stops_runs": _bool,
                  "revision_pending": _bool},
    "run_stop": {"project": _optional(project), "ids": _EXP_IDS, "stop_timeout": _num, "term_timeout": _num,
                 "by": _optional(_dict), "registry": registry_id, "term_first": _bool, "keep_session": _bool},
    "run_verify": {"exp_id": exp_id, "registry": registry_id, "wait": _num},
    "status": {"project": _optional(project), "ids": _EXP_IDS, "last": lambda v, n: _int(v, n, 0, 1 << 20),
               "tail": _bool, "gpus": _bool, "registry": registry_id},
    "gpus": {},
    "slurm_nodes": {},
    "slurm_doctor": {"partition": _optional(_str), "time_limit": _optional(_str)},
    "run_records": {"project": project},
    "log_read": {"exp_id": exp_id, "registry": registry_id, "offset": _optional(_int), "tail_lines": _optional(_int),
                 "max_bytes": lambda v, n: _int(v, n, 0, 1 << 30), "identity": _optional(_str),
                 "series_offset": _optional(_int), "node": _optional(_int)},
    "log_stream": {"exp_id": exp_id, "registry": registry_id, "offset": lambda v, n: _int(v, n, 0, 1 << 62),
                   "identity": _str, "seen": _str, "max_bytes": lambda v, n: _int(v, n, 1, 1 << 30),
                   "poll": _num, "heartbeat": _num, "node": _optional(_int)},
    "ckpt_check": {"path": _str, "configured": _str, "stopping": _EXP_IDS, "busy_check": _bool},
    "ckpt_inventory": {"path": _str, "configured": _str, "keep": _optional(_int), "max_bytes": _optional(_int),
                       "full": _bool, "ignore": _optional(_STRINGS)},
    "ckpt_trash": {"path": _str, "configured": _str, "label": name_part, "stopping": _EXP_IDS,
                   "keep": _optional(_int), "max_bytes": _optional(_int), "purge": _bool,
                   "moved_by": _optional(exp_id), "retention_allowed": _optional(lambda v, n: _list(v, n, name_part)),
                   "purge_only": _optional(lambda v, n: _list(v, n, _dict))},
    "ckpt_restore": {"path": _str, "configured": _str, "name": trash_name},
    "ckpt_move": {"path": _str, "configured": _str},
    "ckpt_purge": {"path": _str, "configured": _str, "names": lambda v, n: _list(v, n, trash_name)},
    "shell": {"argv": _STRINGS, "cwd": _optional(_str), "timeout": _num, "check": _bool, "run": _optional(run_of)},
    "gc": {"project": project, "keep": lambda v, n: _int(v, n, 0, 1 << 20),
           "keep_revisions": lambda v, n: _list(v, n, revision), "checkpoints": _STRINGS, "dry_run": _bool,
           "grace": _num, "only": _optional(_STRINGS), "keep_envs": _optional(lambda v, n: _list(v, n, env_hash))},
    "journal_read": {"ids": lambda v, n: _list(v, n, exp_id), "registry": registry_id},
    "notify_test": {"notify": _dict},
    "env_probe": {"python": _optional(_str)},
    "env_index": {"host": _str, "port": lambda v, n: _int(v, n, 1, 65535), "timeout": _num},
    "env_build": {"hash": env_hash, "requirements": lambda v, n: _str(v, n, ENV_VALUE_CHARS), "python": _optional(_str),
                  "system_site_packages": _bool, "wheels": _optional(wheels), "inputs": _optional(_dict),
                  "installer": lambda v, n: _choice(v, n, ("auto", "uv", "pip")), "timeout": _num,
                  "uv_blob": _optional(sha)},
    "env_use": {"hash": env_hash},
    "env_list": {},
    "files_manifest": {**_PULL_FROM, "globs": _optional(lambda v, n: _list(v, n, pull_glob)),
                       "hash": _optional(lambda v, n: _list(v, n, lambda k, m: k if k == "*" else pull_key(k, m)))},
    "files_send": {**_PULL_FROM, "files": _pull_files},
    "doctor": {"devices": _optional(_STRINGS), "checkpoints": _optional(_str), "torch": _bool},
}


def op_args(op: str, args: dict) -> None:
    """Check the arguments an op names in ``ARGS``; the op's signature refuses unknown ones."""
    for key, check in ARGS.get(op, {}).items():
        if key in args:
            check(args[key], f"{op}.{key}")
    if op in ("run_start", "queue_add") and isinstance(args.get("argv"), list) and isinstance(args.get("env"), dict):
        secrets = args.get("secrets") if isinstance(args.get("secrets"), dict) else {}
        inherited = (args.get("launch") or {}).get("env") or {}  # checked above
        _exec_fits(args["argv"], {**inherited, **args["env"], **secrets}, op)


def request(req: Any) -> dict:
    """The request line: an object with the protocol fields of the right types."""
    if not isinstance(req, dict):
        raise fail(f"the request is a JSON {type(req).__name__}, not an object")
    _str(req.get("root"), "root")
    ops = req.get("ops", [])
    if not isinstance(ops, list) or len(ops) > MAX_ARGS:
        raise fail("ops must be a list")
    for i, item in enumerate(ops):
        if not isinstance(item, dict) or not isinstance(item.get("op"), str):
            raise fail(f"ops[{i}] must be an object with an op name")
        if not isinstance(item.get("args", {}), dict):
            raise fail(f"ops[{i}].args must be an object")
    for item in ops:  # every op's arguments before the first op runs: a start that cannot be stops nothing
        op_args(item["op"], item.get("args", {}))
    _optional(_num)(req.get("lock"), "lock")
    _optional(_str)(req.get("what"), "what")
    _journal_spec(req.get("journal"))
    _expect(req.get("expect"))
    payload_size(req)
    return req


def _expect(spec: Any) -> None:
    """``expect``: the CT the request may run on (``identity.py``)."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise fail("expect must be an object")
    _int(spec.get("vmid"), "expect.vmid", 0, 1 << 31)
    for key in ("node", "hostname", "machine_id", "cluster"):
        _optional(_str)(spec.get(key), f"expect.{key}")
    addresses = spec.get("hwaddrs") or []
    if not isinstance(addresses, list) or len(addresses) > 32:
        raise fail("expect.hwaddrs must be a list")
    for address in addresses:
        _str(address, "expect.hwaddrs[]", 64)


def _journal_spec(spec: Any) -> None:
    """``journal``: which run folder a locked launch records its steps in."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise fail("journal must be an object")
    exp_id(spec.get("exp_id"), "journal.exp_id")
    registry_id(spec.get("registry"), "journal.registry")
    _optional(project)(spec.get("project"), "journal.project")


def payload_size(req: dict) -> int:
    size = req.get("payload", 0)
    return 0 if size is None else _int(size, "payload", 0, 1 << 40)
