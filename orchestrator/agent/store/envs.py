"""The run's Python environments on the target: ``<root>/envs/<hash>``, each a venv built once from its inputs.

An env is built in a folder of its own under ``envs/.store/`` and becomes visible only when the link
``envs/<hash>`` is renamed into place, after the install and the listing of what it holds succeeded: a build
cut halfway leaves no link, so nothing ever runs in a half-built env, and the next build (under the same
per-hash lock) removes the leftover and starts again. Each build journals its steps in
``envs/.store/<name>/build.json`` and keeps the installer's output in ``build.log`` beside it.

Built with uv when it is on the target (``uv venv`` + ``uv pip install``), else ``python -m venv`` + pip.
Wheels pushed by the controller are blobs (``blobs/<sha>``), linked under their file names into the build's
``wheels/`` folder, and installed with no index.

An index URL may carry credentials (``--extra-index-url https://user:token@host``): the requirements file the
installer reads is 0600 while the build runs, and what stays in the store (it, ``build.log``) has them cut out
(``redact``), so no secret outlives the build at rest.

    probe(layout, python=None) -> {"python": "/usr/bin/python3", "version": "3.11.2", "platform": "linux-x86_64",
                                   "glibc": "2.36", "uv": None, "envs": {"0123456789abcdef": {"attrs": "23.2.0"}}}
    build(layout, hash="0123…", requirements="attrs==23.2.0\\n", wheels=[{"name": "attrs-….whl", "sha256": …}])
    -> {"hash": "0123…", "path": "<root>/envs/0123…", "built": True, "packages": {"attrs": "23.2.0"}, ...}
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..layout import Layout, read_json, remove_tree, write_atomic, write_json
from ..protocol import AgentFailure

INFO = "orch-env.json"  # inside a built env: its inputs and what it holds
TAIL_LINES = 15  # of the installer's output, in a failed build's message
LIST = ("import importlib.metadata as m, json, sysconfig\n"
        "site = [sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]\n"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions(path=site)}))\n")
FACTS = ("import json, platform, sys, sysconfig\n"
         "print(json.dumps({'python': sys.executable, 'version': platform.python_version(),\n"
         "                  'platform': sysconfig.get_platform(), 'glibc': platform.libc_ver()[1] or None}))\n")


def folder(layout: Layout) -> str:
    return os.path.join(layout.root, "envs")


def path_of(layout: Layout, env_hash: str) -> str:
    return os.path.join(folder(layout), env_hash)


def _valid(env_hash: str) -> bool:
    return len(env_hash) == 16 and all(c in "0123456789abcdef" for c in env_hash)


def built(layout: Layout) -> list[str]:
    """The hashes of the complete envs (those whose link is in place)."""
    try:
        names = os.listdir(folder(layout))
    except OSError:
        return []
    return sorted(n for n in names if _valid(n) and os.path.isfile(os.path.join(folder(layout), n, INFO)))


def _uv() -> str | None:
    return shutil.which("uv")


def _interpreter(python: str | None) -> str:
    """The interpreter the env is made from: ``python = "3.11"`` is ``python3.11`` on the PATH, else this one."""
    if not python:
        return sys.executable
    if python == ".".join(map(str, sys.version_info[:2])) or python == ".".join(map(str, sys.version_info[:3])):
        return sys.executable
    found = shutil.which(python if python.startswith("python") or "/" in python else f"python{python}")
    if found is None:
        raise AgentFailure("input", f"Python {python} is not installed on the target ([env] python)",
                           f"install python{python} there (with its venv module), or drop [env] python to use "
                           f"the target's {'.'.join(map(str, sys.version_info[:3]))}")
    return found


def probe(layout: Layout, python: str | None = None) -> dict:
    """The interpreter an env would be made from (its version and platform: they are in the env's hash), the
    uv found, and the envs already built."""
    interp = _interpreter(python)
    if interp == sys.executable:
        import platform
        import sysconfig

        facts = {"python": sys.executable, "version": platform.python_version(),
                 "platform": sysconfig.get_platform(), "glibc": platform.libc_ver()[1] or None}
    else:
        out = subprocess.run([interp, "-c", FACTS], capture_output=True, timeout=60)
        if out.returncode != 0:
            raise AgentFailure("agent", f"{interp} did not run: {out.stderr.decode('utf-8', 'replace')[-300:]}")
        facts = json.loads(out.stdout)
    envs = {h: _info(path_of(layout, h)).get("packages") or {} for h in built(layout)}
    return {**facts, "uv": _uv(), "envs": envs}


def index_reachable(layout: Layout, host: str = "pypi.org", port: int = 443, timeout: float = 3.0) -> dict:
    """Whether the target reaches the package index (a TCP connect, name lookup included, within ``timeout``)."""
    found: list = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            found.append(True)
        except OSError:
            pass

    worker = threading.Thread(target=connect, daemon=True)  # a lookup with no DNS server can hang far longer
    worker.start()
    worker.join(timeout)
    return {"reachable": bool(found), "host": host}


class _Lock:
    """One build of a hash at a time, on any number of concurrent deploys; dropped by the kernel if we die."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path, self.timeout = path, timeout

    def __enter__(self) -> "_Lock":
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise AgentFailure("conflict", "another build of this environment is still running",
                                       "wait for it to finish, then deploy again") from None
                time.sleep(0.2)

    def __exit__(self, *_exc: object) -> None:
        os.close(self.fd)


def _info(env_dir: str) -> dict:
    return read_json(os.path.join(env_dir, INFO), {}) or {}


def _clean_leftovers(layout: Layout, env_hash: str) -> None:
    """Store folders of this hash that no link names: builds that were cut."""
    store = os.path.join(folder(layout), ".store")
    link = path_of(layout, env_hash)
    used = os.path.realpath(link) if os.path.islink(link) else None
    for name in os.listdir(store) if os.path.isdir(store) else []:
        full = os.path.join(store, name)
        if name.startswith(env_hash + "-") and os.path.realpath(full) != used:
            remove_tree(layout.root, full)


def _run(argv: list, log, env: dict | None = None, timeout: float = 3600) -> None:
    log.write(("$ " + " ".join(argv) + "\n").encode())
    log.flush()
    try:
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    except FileNotFoundError:
        raise _Failed(f"{argv[0]} is not installed on the target") from None
    except subprocess.TimeoutExpired:
        raise _Failed(f"{os.path.basename(argv[0])} did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        raise _Failed(f"{os.path.basename(argv[0])} {argv[1] if len(argv) > 1 else ''} exited with "
                      f"{proc.returncode}".replace("  ", " "))


class _Failed(Exception):
    pass


_CREDENTIALS = re.compile(r"://[^/@\s]+@")


def redact(text: str) -> str:
    """An index URL's credentials (``https://user:token@host``) cut out: ``https://***@host``."""
    return _CREDENTIALS.sub("://***@", text)


def _redact_file(path: str, mode: int = 0o644) -> None:
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return
    write_atomic(path, redact(text).encode(), mode)


def _tail(log_path: str) -> str:
    try:
        with open(log_path, "rb") as fh:
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return redact("\n".join(f"  {line}" for line in lines[-TAIL_LINES:]))


def _link_wheels(layout: Layout, wheels: list, dest: str) -> None:
    os.makedirs(dest)
    for w in wheels:
        name = w["name"]
        if "/" in name or not name.endswith((".whl", ".tar.gz", ".zip")) or name.startswith("."):
            raise AgentFailure("input", f"not a wheel file name: {name!r}")
        blob = layout.blob(w["sha256"])
        if not os.path.isfile(blob):
            raise AgentFailure("agent", f"the wheel {name} was not pushed to the target", "deploy again")
        os.link(blob, os.path.join(dest, name))


def build(layout: Layout, hash: str, requirements: str, python: str | None = None,  # noqa: A002
          system_site_packages: bool = False, wheels: list | None = None, inputs: dict | None = None,
          installer: str = "auto", timeout: float = 3600, uv_blob: str | None = None) -> dict:
    """Build env ``hash`` unless it is there; what it holds either way. ``wheels`` (pushed as blobs): install
    from them alone, with no index. ``uv_blob``: the controller's uv, pushed as a blob, for a target without one."""
    if not _valid(hash):
        raise AgentFailure("input", f"not an env hash: {hash!r}")
    env_dir = path_of(layout, hash)
    if os.path.isfile(os.path.join(env_dir, INFO)):
        return {**_summary(env_dir, hash), "built": False}
    store = os.path.join(folder(layout), ".store")
    with _Lock(os.path.join(folder(layout), f".{hash}.lock"), timeout):
        if os.path.isfile(os.path.join(env_dir, INFO)):  # another deploy built it while we waited
            return {**_summary(env_dir, hash), "built": False}
        _clean_leftovers(layout, hash)
        os.makedirs(store, exist_ok=True)
        work = tempfile.mkdtemp(dir=store, prefix=f"{hash}-")
        os.chmod(work, 0o755)  # runs of any user may start in it
        journal_path = os.path.join(work, "build.json")
        steps: list = []

        def step(name: str) -> None:
            steps.append({"step": name, "at": time.time()})
            write_json(journal_path, {"hash": hash, "pid": os.getpid(), "steps": steps})

        started = time.monotonic()
        log_path = os.path.join(work, "build.log")
        venv = os.path.join(work, "venv")
        interp = _interpreter(python)
        uv = _uv() if installer in ("auto", "uv") else None
        if uv is None and uv_blob is not None and installer != "pip" and os.path.isfile(layout.blob(uv_blob)):
            from .revisions import _linked

            uv = _linked(layout, uv_blob, 0o755)  # the blob's read-only executable twin
        if installer == "uv" and uv is None:
            raise AgentFailure("input", "[env] installer is uv, and uv is not on the target's PATH",
                               "install uv there, or set [env] installer = \"auto\" (pip when uv is missing)")
        req = os.path.join(work, "requirements.txt")
        write_atomic(req, requirements.encode(), 0o600)  # it may name an index with its credentials
        try:
            with open(log_path, "ab") as log:
                step("venv")
                extra = ["--system-site-packages"] if system_site_packages else []
                if uv:
                    _run([uv, "venv", "--quiet", "--python", interp, *extra, venv], log, timeout=timeout)
                else:
                    _run([interp, "-m", "venv", *extra, venv], log, timeout=timeout)
                step("install")
                source = []
                if wheels is not None:
                    _link_wheels(layout, wheels, os.path.join(work, "wheels"))
                    source = ["--no-index", "--find-links", os.path.join(work, "wheels")]
                py = os.path.join(venv, "bin", "python")
                if uv:
                    env = {**os.environ, "UV_NO_CONFIG": "1"} if wheels is not None else None
                    _run([uv, "pip", "install", "--python", py, *source, "-r", req], log, env=env, timeout=timeout)
                else:
                    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
                    isolated = ["--isolated"] if wheels is not None else []  # no index or links from pip's config
                    _run([py, "-m", "pip", *isolated, "install", "--no-cache-dir", *source, "-r", req], log,
                         env=env, timeout=timeout)
                step("list")
                listed = subprocess.run([py, "-c", LIST], capture_output=True, timeout=120)
                if listed.returncode != 0:
                    raise _Failed("the new env's python could not list its packages")
                packages = {k: v for k, v in sorted(json.loads(listed.stdout).items())
                            if k.lower() not in ("pip", "setuptools", "wheel")}
        except _Failed as exc:
            tail = _tail(log_path)
            remove_tree(layout.root, work)
            raise AgentFailure("input", f"the environment could not be built: {exc}" + (f"\n{tail}" if tail else ""),
                               "fix [env] (its requirements file) and deploy again; the running experiment was "
                               "not touched") from None
        except BaseException:
            remove_tree(layout.root, work)
            raise
        if wheels is not None:
            shutil.rmtree(os.path.join(work, "wheels"), ignore_errors=True)  # links: the blobs stay
        _redact_file(req)  # what the env was built from stays readable, without an index's credentials
        _redact_file(log_path)
        info = {"hash": hash, "python": interp, "installer": "uv" if uv else "pip",
                "system_site_packages": system_site_packages, "inputs": inputs or {},
                "packages": packages, "built": time.time(), "seconds": round(time.monotonic() - started, 2),
                "wheels": [w["sha256"] for w in wheels or []]}
        step("publish")
        write_json(os.path.join(venv, INFO), info)  # inside the venv, where the link points
        tmp_link = os.path.join(folder(layout), f".link-{hash}-{os.getpid()}")
        if os.path.lexists(tmp_link):
            os.unlink(tmp_link)
        os.symlink(os.path.join(".store", os.path.basename(work), "venv"), tmp_link)
        os.replace(tmp_link, env_dir)  # the one step that makes it visible
        return {**_summary(env_dir, hash), "built": True, "seconds": info["seconds"]}


def _summary(env_dir: str, env_hash: str) -> dict:
    info = _info(env_dir)
    return {"hash": env_hash, "path": env_dir, "packages": info.get("packages") or {},
            "installer": info.get("installer"), "python": info.get("python")}


def use(layout: Layout, hash: str) -> dict:  # noqa: A002
    """The env a new run starts in must be there (checked under the lock, before the old run stops)."""
    env_dir = path_of(layout, hash)
    if not _valid(hash) or not os.path.isfile(os.path.join(env_dir, INFO)):
        raise AgentFailure("notfound", f"environment {hash} is not built on the target",
                           "deploy again: it is built before the running experiment is stopped")
    return _summary(env_dir, hash)


def listing(layout: Layout) -> dict:
    """Every env on the target: its hash, size, when built, what it holds, and which runs started in it."""
    users: dict = {}
    for name in os.listdir(layout.runs) if os.path.isdir(layout.runs) else []:
        launch = read_json(os.path.join(layout.runs, name, "launch.json"), {}) or {}
        venv = (launch.get("env") or {}).get("VIRTUAL_ENV")
        if venv:
            users.setdefault(os.path.basename(venv.rstrip("/")), []).append(name)
    out = []
    for env_hash in built(layout):
        env_dir = path_of(layout, env_hash)
        info = _info(env_dir)
        out.append({"hash": env_hash, "path": env_dir, "built": info.get("built"), "python": info.get("python"),
                    "installer": info.get("installer"), "packages": info.get("packages") or {},
                    "bytes": _size(os.path.realpath(env_dir)), "runs": sorted(users.get(env_hash, []))})
    return {"envs": out}


def _size(path: str) -> int:
    total = 0
    for base, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                continue
    return total


def remove(layout: Layout, hash: str) -> int:  # noqa: A002
    """Remove env ``hash`` (its link first, so nothing starts in it while it goes); the bytes freed."""
    env_dir = path_of(layout, hash)
    if not os.path.islink(env_dir):
        return 0
    real = os.path.dirname(os.path.realpath(env_dir))  # .store/<hash>-xxxx (the link names its venv)
    size = _size(real)
    os.unlink(env_dir)
    if os.path.basename(os.path.dirname(real)) == ".store":
        remove_tree(layout.root, real)
    return size
