"""The run's environment, controller side: ``[env]`` read into a spec, its hash, and its build before anything stops.

An env is named by the hash of its inputs: the requirements as resolved from ``[env]`` (a requirements
file, the project's ``pyproject.toml`` dependencies, or a ``uv.lock`` exported to pinned lines), the
target interpreter's version and platform, and whether it sees the system's site packages. The same inputs
on any revision or node give the same hash, so it is built once per target (``agent/store/envs.py``).

With ``wheels = "push"`` (or ``auto`` when the target cannot reach the index) the wheels are resolved and
downloaded here, for the target's Python version and platform, and sent as blobs like a revision's files
(only the missing ones); the target installs them with no index.

    spec(settings) -> {"source": "requirements.txt", "requirements": "attrs==23.2.0\\n", "names": ["attrs"], ...}
    prepare(launch, client, probe) -> {"hash": "0123456789abcdef", "path": "<root>/envs/0123…", "built": False,
                                       "packages": {"attrs": "23.2.0"}}
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError, InputError
from ..reach.agent_client import Op

if TYPE_CHECKING:
    from ..config import Settings
    from ..reach.agent_client import AgentClient
    from ..reach.targets import Target
    from .meter import Meter
    from .model import Launch

TAIL_LINES = 15
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _names(text: str) -> list[str]:
    """The packages a requirements text names (options, comments and blank lines left out)."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-") and (m := _NAME.match(line)):
            out.append(m.group(1))
    return out


def _uv_bin() -> str | None:
    try:
        from uv import find_uv_bin  # the uv package, when it is installed beside orch

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def _requirements(settings: Settings) -> tuple[str, str]:
    """(where the requirements come from, their text)."""
    env, root = settings.env, settings.project_dir
    if env.requirements:
        path = root / env.requirements
        try:
            return env.requirements, path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"[env] requirements: {path} does not exist",
                              hint="name a requirements file beside orch.toml, or remove [env]") from None
    if env.pyproject:
        import tomllib

        path = root / "pyproject.toml"
        try:
            deps = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {}).get("dependencies", [])
        except FileNotFoundError:
            raise ConfigError(f"[env] pyproject = true, and {path} does not exist",
                              hint="add a pyproject.toml that lists the dependencies, or name a requirements "
                                   "file instead") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        return "pyproject.toml", "".join(f"{d}\n" for d in deps)
    assert env.lock
    uv = _uv_bin()
    if uv is None:
        raise ConfigError(f"[env] lock = {env.lock!r} is exported with uv, and uv is not installed here",
                          hint="pip install uv (beside orch), or name a requirements file instead")
    lock = root / env.lock
    if not lock.is_file():
        raise ConfigError(f"[env] lock: {lock} does not exist", hint="run uv lock, or remove [env] lock")
    out = subprocess.run([uv, "export", "--format", "requirements-txt", "--frozen", "--no-hashes",
                          "--no-emit-project", "--no-header"], cwd=lock.parent, capture_output=True)
    if out.returncode != 0:
        raise ConfigError(f"uv could not export {lock}: {out.stderr.decode('utf-8', 'replace').strip()[-500:]}",
                          hint="bring the lock file up to date (uv lock) and deploy again")
    return env.lock, out.stdout.decode()


def spec(settings: Settings) -> dict | None:
    """The run's environment as ``[env]`` asks for it (None: no ``[env]``, the target's python as it is)."""
    env = settings.env
    if not env.active:
        return None
    source, text = _requirements(settings)
    return {"source": source, "requirements": text, "names": _names(text), "python": env.python,
            "system_site_packages": env.system_site_packages, "wheels": env.wheels, "installer": env.installer}


def _redact(text: str) -> str:
    """An index URL's credentials (``https://user:token@host``) are never recorded, nor part of the env's name."""
    from ..agent.store.envs import redact

    return redact(text)


INDEX_OPTIONS = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host")


def without_index(text: str) -> str:
    """The requirements as a target installing pushed wheels reads them: no index or link options (with the
    credentials they may carry), which it would not use (it installs with no index)."""
    def names_index(line: str) -> bool:
        word = line.strip().split("#", 1)[0].strip()
        return any(word == o or word.startswith((o + " ", o + "=", o + "\t")) or (len(o) == 2 and
                   word.startswith(o) and len(word) > 2) for o in INDEX_OPTIONS)

    return "".join(line for line in text.splitlines(keepends=True) if not names_index(line))


def probe_op(env: dict) -> Op:
    return Op("env_probe", {"python": env.get("python")})


def env_hash(env: dict, facts: dict) -> str:
    """The env's name: its requirement lines, the interpreter's version and platform, its site packages."""
    lines = [_redact(ln.strip()) for ln in env["requirements"].splitlines() if ln.split("#", 1)[0].strip()]
    key = {"requirements": lines, "python": facts["version"], "platform": facts["platform"],
           "glibc": facts.get("glibc"), "system_site_packages": bool(env.get("system_site_packages"))}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def path_on(root: str, env_hash_: str) -> str:
    return f"{root.rstrip('/')}/envs/{env_hash_}"


def platforms(facts: dict) -> list[str]:
    """The wheel platform tags the target's interpreter accepts, most specific first."""
    plat = str(facts["platform"])  # sysconfig's: linux-x86_64, macosx-14.0-arm64
    if not plat.startswith("linux-"):
        return [plat.replace("-", "_").replace(".", "_")]
    arch = plat.split("-", 1)[1]
    tags = []
    glibc = facts.get("glibc")
    if glibc and re.fullmatch(r"2\.\d+", glibc):
        minor = int(glibc.split(".")[1])
        tags += [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)]
        tags += [f"manylinux{y}_{arch}" for y, m in (("2014", 17), ("2010", 12), ("1", 5)) if minor >= m]
    return tags + [f"linux_{arch}"]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "orch" / "wheels"


def resolve_wheels(env: dict, facts: dict) -> list[dict]:
    """Resolve and download the wheels for the target's Python and platform, here; each as
    ``{"name", "sha256", "size", "local"}``. Refused with pip's last lines when they cannot be resolved."""
    version = ".".join(str(facts["version"]).split(".")[:2])
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".resolve-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(env["requirements"], encoding="utf-8")
        dest = Path(tmp) / "wheels"
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
                "--dest", str(dest), "--only-binary=:all:", "--python-version", version,
                "--implementation", "cp"]
        for tag in platforms(facts):
            argv += ["--platform", tag]
        argv += ["-r", str(req)]
        try:
            out = subprocess.run(argv, capture_output=True, timeout=1800)
        except subprocess.TimeoutExpired:
            raise InputError("pip download did not finish within 30 minutes",
                             hint="check this machine's access to the package index") from None
        if out.returncode != 0:
            text = (out.stdout + out.stderr).decode("utf-8", "replace").strip().splitlines()
            tail = "\n".join(f"  {line}" for line in text[-TAIL_LINES:])
            raise InputError(f"the environment's wheels could not be resolved for Python {version} on "
                             f"{facts['platform']} ([env] {env['source']}):\n{tail}",
                             hint="fix the requirements (a version that exists, with wheels for that Python) "
                                  "and deploy again; nothing was changed on the target")
        found = []
        for path in sorted(dest.iterdir()):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            kept = cache / digest
            if not kept.exists():
                os.replace(path, kept)
            found.append({"name": path.name, "sha256": digest, "size": kept.stat().st_size, "local": kept})
        return found


def _push_files(settings: Settings, client: AgentClient, files: list[dict], meter: Meter | None) -> dict:
    """Send the files (``name``, ``sha256``, ``size``, ``local``) the target's blob store lacks, as a push does."""
    from . import push
    from .revisions import Revision

    entries = [{"path": w["name"], "sha256": w["sha256"], "size": w["size"], "mode": 0o644} for w in files]
    as_tree = Revision(id="env", files=entries, root=_cache_dir(), local_paths={w["name"]: w["local"] for w in files})
    missing = client.one("blobs_missing", hashes=sorted({w["sha256"] for w in files}))
    return push.send(client, as_tree, missing, meter=meter, stall=settings.ssh.command_timeout)


def _uv_to_push(env: dict, facts: dict) -> dict | None:
    """This machine's uv, for a target without one on the same platform (a static binary runs there as is)."""
    import sysconfig

    if env["installer"] == "pip" or facts.get("uv") or facts["platform"] != sysconfig.get_platform():
        return None
    found = _uv_bin()
    if found is None:
        return None
    data = Path(found).read_bytes()
    return {"name": "uv", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "local": Path(found)}


def prepare(launch: Launch, client: AgentClient, probe: dict) -> dict | None:
    """The env the new run starts in, built on the target unless it is there (``launch.venv`` set to it);
    a build that fails raises with the installer's last lines, before anything stops."""
    if launch.inputs.env is None or "env" not in probe:
        return None
    launch.venv = ensure(launch.settings, launch.target, client, launch.inputs.env, probe["env"],
                         echo=launch.echo, meter=launch.progress)
    return launch.venv


def ensure(settings: Settings, target: Target, client: AgentClient, env: dict, facts: dict, *,
           echo: Callable[[str], None], meter: Meter | None = None) -> dict:
    """Env ``env`` on ``target`` (``facts``: its ``env_probe``), built unless it is there."""
    name = env_hash(env, facts)
    path = path_on(target.root, name)
    if name in (facts.get("envs") or {}):
        return {"hash": name, "path": path, "built": False, "packages": facts["envs"][name]}
    mode = env["wheels"]
    if mode == "auto":
        mode = "index" if client.one("env_index", host="pypi.org", port=443, timeout=3.0)["reachable"] else "push"
    wheels = None
    started = time.monotonic()
    files = []
    if mode == "push":
        wheels = resolve_wheels(env, facts)
        files += wheels
    uv = _uv_to_push(env, facts)
    files += [uv] if uv else []
    pushed = _push_files(settings, client, files, meter) if files else {}
    echo(f"orch: building the environment {name} on {target.label} ({len(env['names'])} requirements"
         f"{', ' + str(len(wheels)) + ' wheels pushed' if wheels is not None else ''})")
    timeout = settings.env.build_timeout
    requirements = env["requirements"] if wheels is None else without_index(env["requirements"])
    args = {"hash": name, "requirements": requirements, "python": env.get("python"),
            "system_site_packages": bool(env.get("system_site_packages")), "installer": env["installer"],
            "wheels": [{"name": w["name"], "sha256": w["sha256"]} for w in wheels] if wheels is not None else None,
            "inputs": {"source": env["source"], "python": facts["version"], "platform": facts["platform"]},
            "timeout": timeout, "uv_blob": uv["sha256"] if uv else None}
    built = client.call([Op("env_build", args)], what="build the environment", timeout=timeout + 60)[0]
    return {"hash": name, "path": path, "built": built["built"], "packages": built["packages"],
            "seconds": round(time.monotonic() - started, 2), "wheels": len(wheels or []),
            "pushed_bytes": pushed.get("bytes", 0), "installer": built.get("installer")}


def record(launch: Launch) -> dict | None:
    """What the experiment records of its env: the hash, the spec and the exact installed set."""
    env, venv = launch.inputs.env, launch.venv
    if env is None or venv is None:
        return None
    shown = {**env, "requirements": _redact(env["requirements"])}
    return {"hash": venv["hash"], "packages": venv["packages"], "spec": shown}


def run_env(launch: Launch) -> dict:
    """The variables that put the env first on the run's PATH (the agent prepends ``$VIRTUAL_ENV/bin``)."""
    return {"VIRTUAL_ENV": launch.venv["path"]} if launch.venv else {}



def build(settings: Settings, target: Target, *, echo: Callable[[str], None], meter: Meter | None = None) -> dict:
    """``orch env build``: the project's ``[env]`` built on ``target`` ahead of a deploy."""
    from ..records.reconcile import client_for

    env = spec(settings)
    if env is None:
        raise ConfigError("this project has no [env] to build",
                          hint='add [env] requirements = "requirements.txt" to orch.toml')
    client = client_for(settings, target)
    try:
        facts = client.call([probe_op(env)], what="env probe")[0]
        return {"target": target.label, **ensure(settings, target, client, env, facts, echo=echo, meter=meter)}
    finally:
        client.transport.close()


def listing(settings: Settings, target: Target, registry) -> list[dict]:
    """``orch env list``: the target's envs, the runs started in each, and this registry's experiments using it."""
    from ..records.reconcile import client_for

    client = client_for(settings, target, read_only=True)
    try:
        found = client.one("env_list")["envs"]
    finally:
        client.transport.close()
    users = registry.env_users(target.machine)
    return [{**e, "experiments": users.get(e["hash"], [])} for e in found]
