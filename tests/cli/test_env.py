"""The run's environment ([env]) on the local target, with the real CLI: wheels resolved from the package index on
this machine, pushed as blobs, installed with no index into ``<root>/envs/<hash>``, built before anything stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.test_into import cli_argv, drive_pty
from tests.conftest import tmux_socket, wait_for

TRAIN = """\
import os, shutil, sys, time
import six, tomli
print(f"six={six.__version__} tomli={tomli.__name__} python={shutil.which('python3')}", flush=True)
for step in range(int(os.environ.get("ENV_STEPS", "1"))):
    print(f"step={step} loss=1.0", flush=True)
    time.sleep(0.2)
"""


def _setup(project, requirements: str, steps: int = 1, extra: str = "", wheels: str = "push") -> None:
    (project.path / "train.py").write_text(TRAIN)
    (project.path / "requirements.txt").write_text(requirements)
    project.configure(extra=f'\n[env]\nrequirements = "requirements.txt"\nwheels = "{wheels}"\n{extra}')
    text = (project.path / "orch.toml").read_text().replace('TINYLM_STEPS = ', f'ENV_STEPS = "{steps}", X = ')
    (project.path / "orch.toml").write_text(text)


WHEELS = ("six==1.15.0", "six==1.16.0", "tomli==2.0.1")


def download_wheels(dest: Path, wanted: tuple[str, ...] = WHEELS) -> Path:
    """The tests' wheels from the package index, once per session: orch then resolves from this folder alone
    (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``), so its own downloads never wait on the network."""
    if not any(dest.iterdir()):
        for req in wanted:
            got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                                  "--retries", "1", "--timeout", "20", "--dest", str(dest), req],
                                 capture_output=True, text=True)
            assert got.returncode == 0, got.stderr
    return dest


@pytest.fixture(scope="session")
def wheels_folder(tmp_path_factory) -> Path:
    return download_wheels(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch, wheels_folder):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the wheels orch downloads: this test's own
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels_folder))
    # a local target's own installer (uv, from "the index") sees the same folder
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels_folder))


def _envs(project) -> list[str]:
    folder = project.root / "envs"
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def _log(project, exp_id: int) -> str:
    return (project.run_dir(exp_id) / "train.log").read_text()


def _exp(project, exp_id: int):
    with project.registry() as reg:
        return reg.get(exp_id)


def test_run_imports_pushed_packages_and_a_code_change_builds_nothing(project):
    _setup(project, "six==1.16.0\ntomli==2.0.1\n")
    dry = project.run("deploy", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "build_env: build the environment of requirements.txt (2 requirements" in dry.stdout
    assert dry.stdout.index("build_env") < dry.stdout.index("stop_run")
    assert "would be built" in dry.stdout
    assert not (project.root / "envs").exists()  # a dry run builds nothing

    first = project.run("deploy", "--wait", "20")
    assert first.returncode == 0, first.stderr
    assert "building the environment" in first.stderr
    (env_hash,) = _envs(project)
    wait_for(lambda: "six=" in _log(project, 1), what="the run's first line")
    venv = project.root / "envs" / env_hash
    assert f"six=1.16.0 tomli=tomli python={venv}/bin/python3" in _log(project, 1)
    exp = _exp(project, 1)
    assert exp.env["hash"] == env_hash
    assert exp.env["packages"] == {"six": "1.16.0", "tomli": "2.0.1"}
    assert f"env          {env_hash} (2 packages" in project.run("experiments", "show", "1").stdout
    launch = json.loads((project.run_dir(1) / "launch.json").read_text())
    assert launch["env"]["VIRTUAL_ENV"] == str(venv)

    (project.path / "train.py").write_text(TRAIN + "# a code change only\n")
    store = sorted((project.root / "envs" / ".store").iterdir())
    assert f"environment {env_hash}: there, nothing to build" in project.run("deploy", "--dry-run").stdout
    second = project.run("deploy", "--wait", "20")
    assert second.returncode == 0, second.stderr
    assert "building the environment" not in second.stderr
    assert _envs(project) == [env_hash] and sorted((project.root / "envs" / ".store").iterdir()) == store
    assert _exp(project, 2).env["hash"] == env_hash
    assert _exp(project, 2).revision != exp.revision

    shown = project.run("env", "list", "--json")
    assert shown.returncode == 0, shown.stderr
    (listed,) = json.loads(shown.stdout)["envs"]
    assert listed["hash"] == env_hash and listed["experiments"] == [1, 2]
    one = project.run("env", "show")  # the latest experiment's
    assert one.returncode == 0, one.stderr
    assert f"environment {env_hash} on local" in one.stdout and "tomli" in one.stdout
    ahead = project.run("env", "build")
    assert ahead.returncode == 0, ahead.stderr
    assert f"local: environment {env_hash} is there already" in ahead.stdout
    missing = project.run("env", "show", "f" * 16)
    assert missing.returncode != 0 and "error: no environment ffffffffffffffff on local" in missing.stderr

    ran = project.run("exec", "--", "python3", "-c", "import six, sys; print(six.__version__, sys.prefix)")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["1.16.0", str(venv)]

    code, screen = drive_pty(cli_argv("ssh"), project.path, [("", b"echo env-$VIRTUAL_ENV-$(command -v python3)-end\r"),
                                                             ("-end", b"exit\r")], env={"SHELL": "/bin/sh"})
    assert code == 0, screen
    assert f"env-{venv}-{venv}/bin/python3-end" in screen  # after the login shell's profile set its PATH

    restarted = project.run("restart", "--wait", "20")  # the parent's env, still there: nothing to build
    assert restarted.returncode == 0, restarted.stderr
    assert "building the environment" not in restarted.stderr
    assert _exp(project, 3).env["hash"] == env_hash and _exp(project, 3).parent == 2


def test_changed_requirement_builds_before_the_old_run_stops_and_compare_shows_it(project):
    _setup(project, "six==1.16.0\ntomli==2.0.1\n", steps=1000)
    assert project.run("deploy").returncode == 0
    wait_for(lambda: "step=" in _log(project, 1), what="the first run's steps")
    (old_hash,) = _envs(project)
    shown = subprocess.run(["tmux", "-L", tmux_socket(str(project.root)), "show-environment", "-t", "orch-tinylm",
                            "PATH"], capture_output=True, text=True)  # what a window opened after attach sees
    assert shown.stdout.startswith(f"PATH={project.root}/envs/{old_hash}/bin:"), shown
    (project.path / "requirements.txt").write_text("six==1.15.0\ntomli==2.0.1\n")
    out = project.run("deploy")
    assert out.returncode == 0, out.stderr
    new_hash = next(h for h in _envs(project) if h != old_hash)
    info = json.loads((project.root / "envs" / new_hash / "orch-env.json").read_text())
    old = _exp(project, 1)
    assert old.status == "stopped"
    assert old.ended > info["built"]  # the old run was stopped only once the new env was there
    assert _exp(project, 2).env["packages"]["six"] == "1.15.0"
    shown = subprocess.run(["tmux", "-L", tmux_socket(str(project.root)), "show-environment", "-t", "orch-tinylm",
                            "PATH"], capture_output=True, text=True)  # the second start was the standby's: the same
    assert shown.stdout.startswith(f"PATH={project.root}/envs/{new_hash}/bin:"), shown
    took = json.loads((project.run_dir(2) / "pid.json").read_text())["supervisor"]
    assert b"standby" in Path(f"/proc/{took}/cmdline").read_bytes().split(b"\0")

    compared = project.run("experiments", "compare", "1", "2")
    assert compared.returncode == 0, compared.stderr
    assert "six 1.16.0 → 1.15.0" in compared.stdout
    assert project.run("stop").returncode == 0

    # gc: the first env is used by no kept experiment once its run folder goes
    old_time = time.time() - 7200
    for path in [project.root / "envs", *(project.root / "envs").rglob("*"), *(project.root / "runs").rglob("*")]:
        os.utime(path, (old_time, old_time), follow_symlinks=False)
    gone = project.run("gc", "--keep", "1", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert _envs(project) == [new_hash]
    assert len(list((project.root / "envs" / ".store").iterdir())) == 1


def test_unresolvable_requirement_refuses_before_the_old_run_stops(project):
    _setup(project, "six==1.16.0\ntomli==2.0.1\n", steps=1000)
    assert project.run("deploy").returncode == 0
    wait_for(lambda: "step=" in _log(project, 1), what="the first run's steps")
    (project.path / "requirements.txt").write_text("six==99.0.0\n")
    before = _envs(project)
    out = project.run("deploy")
    assert out.returncode != 0
    assert "error: the environment's wheels could not be resolved" in out.stderr
    assert "six==99.0.0" in out.stderr and "hint:" in out.stderr
    assert _envs(project) == before
    assert _exp(project, 1).status == "running"
    with project.registry() as reg:
        assert [e.status for e in reg.list()] == ["running"]  # no row was added, none left launching
    n = _log(project, 1).count("step=")
    wait_for(lambda: _log(project, 1).count("step=") > n, what="the old run to go on")
    assert project.run("stop").returncode == 0


def test_failing_install_on_the_target_names_the_installers_last_lines(project):
    """Installed from the index by the target itself: its installer fails, the deploy is refused with its output."""
    _setup(project, "six==1.16.0\ntomli==2.0.1\n", steps=1000, wheels="index")
    assert project.run("deploy", timeout=300).returncode == 0
    wait_for(lambda: "step=" in _log(project, 1), what="the first run's steps")
    (project.path / "requirements.txt").write_text("six==99.0.0\ntomli==2.0.1\n")
    out = project.run("deploy", timeout=300)
    assert out.returncode != 0
    assert "error: the environment could not be built: " in out.stderr
    assert "six==99.0.0" in out.stderr.split("error:", 1)[1]  # the installer's own words
    assert "hint:" in out.stderr and "the running experiment was not touched" in out.stderr
    assert len(_envs(project)) == 1
    assert _exp(project, 1).status == "running"
    with project.registry() as reg:
        assert [e.status for e in reg.list()] == ["running"]
    assert project.run("stop").returncode == 0


def test_a_build_cut_midway_is_never_used_and_the_next_deploy_completes_it(project):
    _setup(project, "six==1.16.0\ntomli==2.0.1\n", extra='installer = "pip"\n')  # venv + pip: seconds to cut into
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy"], cwd=project.path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    store = project.root / "envs" / ".store"

    def building() -> list[int]:
        pids = []
        for proc_dir in Path("/proc").iterdir():
            try:
                cmd = (proc_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if proc_dir.name.isdigit() and str(store).encode() in cmd:
                pids.append(int(proc_dir.name))
        return pids

    pids = wait_for(building, timeout=120, what="the build to start")
    for pid in pids:  # the installer and the agent that started it (its process group), then orch
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert _envs(project) == []  # a half-built env is never visible
    assert list(store.iterdir())  # its leftover, cleaned by the next build

    again = project.run("deploy", "--wait", "30", timeout=300)
    assert again.returncode == 0, again.stderr
    (env_hash,) = _envs(project)
    assert len(list(store.iterdir())) == 1
    exp = _exp(project, 1)  # the cut deploy recorded nothing: the build comes before the record
    wait_for(lambda: "six=" in _log(project, 1), what="the run's first line")
    assert "six=1.16.0" in _log(project, 1) and exp.env["hash"] == env_hash


class PrivateIndex:
    """A real package index (PEP 503 simple pages) over the session's wheels, on loopback, that answers only the
    credentials ``reader:T0PASSWORD`` (HTTP basic auth), as a private index does."""

    def __init__(self, wheels: Path) -> None:
        import base64
        import html
        import re
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        want = "Basic " + base64.b64encode(b"reader:T0PASSWORD").decode()
        self.asked: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                index.asked.append(self.path)
                if self.headers.get("Authorization") != want:
                    return self._answer(401, b"", "text/plain")
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) == 2 and parts[0] == "simple":
                    name = re.sub(r"[-_.]+", "_", parts[1]).lower()
                    links = "".join(f'<a href="/files/{html.escape(w.name)}">{html.escape(w.name)}</a>'
                                    for w in sorted(wheels.iterdir()) if w.name.lower().startswith(name + "-"))
                    return self._answer(200, f"<html><body>{links}</body></html>".encode(), "text/html")
                if len(parts) == 2 and parts[0] == "files" and (wheels / parts[1]).is_file():
                    return self._answer(200, (wheels / parts[1]).read_bytes(), "application/octet-stream")
                return self._answer(404, b"", "text/plain")

            def do_HEAD(self) -> None:  # noqa: N802 (uv asks a wheel's size first)
                self.head = True
                self.do_GET()

            def _answer(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                if code == 401:
                    self.send_header("WWW-Authenticate", 'Basic realm="index"')
                self.end_headers()
                if not getattr(self, "head", False):
                    self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://reader:T0PASSWORD@127.0.0.1:{self.server.server_address[1]}/simple"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("wheels", ["push", "index"])
def test_an_index_s_credentials_are_kept_nowhere_on_the_target(project, wheels_folder, monkeypatch, wheels):
    """``--extra-index-url http://user:PASSWORD@…`` in requirements.txt: with pushed wheels the target never gets
    the option; installing from the (private, password-only) index it reads it from a 0600 file, and the copy the
    store keeps, and the installer's log, have the credentials cut out. Nothing under the target's root holds the
    password, and none of orch's output shows it."""
    index = PrivateIndex(wheels_folder)
    try:
        monkeypatch.delenv("UV_FIND_LINKS")  # the target's installer must go to the private index
        monkeypatch.delenv("PIP_FIND_LINKS")
        monkeypatch.delenv("PIP_NO_INDEX")
        monkeypatch.setenv("UV_INDEX_URL", index.url.replace("reader:T0PASSWORD@", ""))  # no other index
        if wheels == "push":  # the controller resolves from the index too, with the file's credentials
            monkeypatch.setenv("PIP_INDEX_URL", index.url.replace("reader:T0PASSWORD@", ""))
        _setup(project, f"--extra-index-url {index.url}\nsix==1.16.0\ntomli==2.0.1\n", wheels=wheels)
        res = project.run("deploy", "--wait", "20", timeout=300)
        assert res.returncode == 0, res.stderr
        assert any(p.startswith("/simple/six") for p in index.asked)
    finally:
        index.close()
    (kept,) = (project.root / "envs" / ".store").glob("*/requirements.txt")
    assert ("--extra-index-url http://***@127.0.0.1:" in kept.read_text()) == (wheels == "index")
    assert "six==1.16.0" in kept.read_text()
    for path in project.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert b"T0PASSWORD" not in path.read_bytes(), path
    shown = project.run("env", "show", "--json")
    assert "T0PASSWORD" not in res.stdout + res.stderr + shown.stdout + shown.stderr
    assert project.run("stop").returncode == 0
