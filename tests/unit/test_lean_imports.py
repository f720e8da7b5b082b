"""What the everyday commands import: the real CLI in a subprocess, its ``sys.modules`` read at exit.

Each command has an explicit list of modules it must not load, each with the reason it has no business
there. A new eager import on one of these paths (a module-level ``import numpy`` in something status
reaches, say) fails here with the module, the command and the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, Project, tmux_socket

# Runs the CLI like the ``orch`` script does and writes every loaded module's name to $LEAN_MODULES at exit.
WRAPPER = """\
import atexit, json, os, sys
atexit.register(lambda: open(os.environ["LEAN_MODULES"], "w").write(json.dumps(sorted(sys.modules))))
from orchestrator.cli.main import main
main(sys.argv[1:])
"""

SSH = "SSH libraries load only when an SSH connection is really made"
PVE = "the Proxmox client loads only for a Proxmox lookup (a CT id, `orch targets`)"
NUMPY = "numpy loads only for batching (a [batching] lengths file, `orch batching`)"
RICH = "rich loads only to render a table or a progress bar on a terminal"
PLOT = "matplotlib loads only for `orch experiments plot`"
TOML_W = "tomlkit loads only to rewrite orch.toml (`orch init`, `orch use`)"
WEB = "the web server loads only for `orch ui`"
NEVER = {
    "paramiko": SSH, "invoke": SSH, "cryptography": SSH, "nacl": SSH, "bcrypt": SSH,
    "orchestrator.reach.transport.ssh": SSH, "orchestrator.reach.transport.hostkeys": SSH,
    "proxmoxer": PVE, "requests": PVE, "urllib3": PVE, "orchestrator.reach.proxmox": PVE,
    "numpy": NUMPY, "orchestrator.batching": NUMPY,
    "rich": RICH,
    "matplotlib": PLOT, "orchestrator.records.plots": PLOT, "tomlkit": TOML_W,
    "starlette": WEB, "uvicorn": WEB, "orchestrator.ui.server": WEB,
}
# The [batching] key table (stdlib only), which the settings are built from; the package loads nothing else.
KEY_TABLES = {"orchestrator.batching", "orchestrator.batching.config"}
NO_CONFIG = "help text needs no loaded configuration, registry or playbook"
READ_ONLY = "reading a run's state needs none of the launch machinery"
METADATA = "pydantic's plugin loader loads without importlib.metadata (cli/pydantic_plugins.py)"
SERIES = ("a status reads the series the run's supervisor kept; the log reader loads only for [metrics] patterns "
          "or a run without a series")
FORBIDDEN = {
    "help": {**NEVER, "pydantic": NO_CONFIG, "sqlite3": NO_CONFIG, "yaml": NO_CONFIG,
             "orchestrator.config": NO_CONFIG, "orchestrator.records.experiments": NO_CONFIG,
             "orchestrator.reach.agent_client": NO_CONFIG, "orchestrator.launch.playbooks": NO_CONFIG},
    "status": {**NEVER, "yaml": READ_ONLY, "orchestrator.launch.playbooks": READ_ONLY,
               "orchestrator.launch.operations": READ_ONLY, "orchestrator.launch.multinode": READ_ONLY,
               "orchestrator.launch.push": READ_ONLY, "orchestrator.launch.revisions": READ_ONLY,
               "orchestrator.watch.logparse": SERIES, "orchestrator.agent.metrics": SERIES,
               "importlib.metadata": METADATA},
    "deploy": {**NEVER, "importlib.metadata": METADATA},
    "dry-run": {**NEVER, "importlib.metadata": METADATA},
}


def loaded(proj: Project, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    out = proj.path / ".lean-modules.json"
    env = dict(os.environ, LEAN_MODULES=str(out))
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=proj.path, capture_output=True, text=True,
                          timeout=120, env=env)
    return proc, set(json.loads(out.read_text()))


def offending(modules: set[str], command: str) -> list[str]:
    """``module (reason)`` for each forbidden module (or a submodule of one) that was loaded."""
    rules = FORBIDDEN[command]
    hits = {rule for m in modules - KEY_TABLES for rule in rules if m == rule or m.startswith(rule + ".")}
    return sorted(f"{rule} ({rules[rule]})" for rule in hits)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A local project with one real run (a real deploy), so status and a dry run see a live target."""
    tmp = tmp_path_factory.mktemp("lean")
    path = tmp / "proj"
    path.mkdir()
    shutil.copy(EXAMPLE / "train.py", path / "train.py")
    proj = Project(path, tmp / "target")
    proj.configure(steps=100000, sleep=0.05)
    proc, modules = loaded(proj, "deploy", "-m", "lean start-up")
    assert proc.returncode == 0, proc.stderr
    yield proj, modules
    subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "stop"], cwd=path, capture_output=True,
                   timeout=60)
    subprocess.run(["tmux", "-L", tmux_socket(str(proj.root)), "kill-server"], capture_output=True)


def test_help_loads_only_the_parser(deployed):
    proj, _ = deployed
    proc, modules = loaded(proj, "--help")
    assert proc.returncode == 0 and "deploy" in proc.stdout, proc.stderr
    bad = offending(modules, "help")
    assert not bad, "orch --help loads modules it does not need: " + "; ".join(bad)


def test_status_of_a_local_run_loads_no_launch_ssh_or_numpy(deployed):
    proj, _ = deployed
    proc, modules = loaded(proj, "status")
    assert proc.returncode == 0 and "running" in proc.stdout, proc.stdout + proc.stderr
    assert "orchestrator.reach.agent_client" in modules  # it did ask the target
    bad = offending(modules, "status")
    assert not bad, "orch status loads modules it does not need: " + "; ".join(bad)


def test_deploy_dry_run_on_a_local_project_loads_no_ssh_or_numpy(deployed):
    proj, _ = deployed
    proc, modules = loaded(proj, "deploy", "--dry-run")
    assert proc.returncode == 0 and "would stop" in proc.stdout, proc.stdout + proc.stderr
    bad = offending(modules, "dry-run")
    assert not bad, "orch deploy --dry-run loads modules it does not need: " + "; ".join(bad)


def test_a_local_deploy_loads_no_ssh_proxmox_or_numpy(deployed):
    _, modules = deployed
    bad = offending(modules, "deploy")
    assert not bad, "orch deploy (local) loads modules it does not need: " + "; ".join(bad)


def test_the_check_sees_a_module_loaded_late():
    """The rule matches submodules too, so a lazy ``import numpy.linalg`` deep in a command is caught."""
    assert offending({"numpy.linalg", "json"}, "status") == [f"numpy ({NUMPY})"]
    assert offending({"orchestrator.batching.sampler"}, "help") == [f"orchestrator.batching ({NUMPY})"]
    assert offending({"orchestrator.batching", "orchestrator.batching.config"}, "status") == []


HELPS = (["--help"], ["experiments", "--help"], ["deploy", "--help"], ["checkpoints", "--help"])


@pytest.mark.parametrize("args", HELPS, ids=lambda a: " ".join(a))
def test_the_lazy_command_table_prints_the_same_help_as_typer(args):
    eager = ("import sys, typer\nfrom orchestrator.cli.main import app\n"
             "typer.main.get_command(app).main(args=sys.argv[1:], prog_name='orch')\n")
    shown = [subprocess.run([sys.executable, *how, *args], capture_output=True, text=True, timeout=60)
             for how in (["-c", eager], ["-m", "orchestrator.cli.main"])]
    assert shown[0].returncode == shown[1].returncode == 0, shown[1].stderr
    assert shown[1].stdout == shown[0].stdout


def test_help_builds_no_sub_command_and_a_call_builds_only_its_own():
    from orchestrator.cli.main import LazyCommands, app, lazy_command

    root = lazy_command(app)
    assert isinstance(root.commands, LazyCommands)
    with pytest.raises(SystemExit) as shown:
        root.main(["--help"], prog_name="orch", standalone_mode=True)
    assert shown.value.code == 0
    assert root.commands._built == {}
    with pytest.raises(SystemExit):
        root.main(["experiments", "--help"], prog_name="orch")
    assert list(root.commands._built) == ["experiments"]


# The `orch` script's own process when a warm process takes the command: it only passes its terminal on.
FRONT = """\
import json, os, sys
from orchestrator.main import main
def write():
    open(os.environ["LEAN_MODULES"], "w").write(json.dumps(sorted(sys.modules)))
end = os._exit
def ended(code):  # a command the warm process ran ends this process with os._exit
    write()
    end(code)
os._exit = ended
try:
    main()
finally:
    write()
"""
FRONT_ONLY = "the process that hands a command to the warm process imports only what sends it"


def test_the_command_handed_to_a_warm_process_imports_nothing_it_does_not_send_it_with(project):
    """Every command pays this process's imports before the warm process starts on it."""
    import time

    from orchestrator.warm import client as warm_client

    out = project.path / ".front-modules.json"
    env = {k: v for k, v in os.environ.items() if k != "ORCH_WARM"}
    env["LEAN_MODULES"] = str(out)

    def front() -> set[str]:
        done = subprocess.run([sys.executable, "-c", FRONT, "experiments", "list"], cwd=project.path,
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        return set(json.loads(out.read_text()))

    try:
        assert "orchestrator.cli.main" in front()  # no warm process yet: run here, and one starts as it ends
        deadline = time.monotonic() + 30
        while not (os.path.exists(warm_client.socket_path()) and warm_client.processes()):
            assert time.monotonic() < deadline, "no warm process came up"
            time.sleep(0.1)
        modules = front()
        assert "orchestrator.warm.client" in modules and "orchestrator.cli.main" not in modules, \
            "the command was not handed to the warm process"
        # beyond what Python itself loads here (an editable install's path finder imports pathlib, a wheel's not)
        bare = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sorted(sys.modules)))"],
                              capture_output=True, text=True, timeout=60, env=env)
        added = modules - set(json.loads(bare.stdout))
        for name in ("pathlib", "typing", "typer", "pydantic", "sqlite3", "orchestrator.config",
                     # the built-in _socket, _signal, marshal and Python's own sha256 do its work
                     "socket", "signal", "hashlib", "struct", "selectors", "threading", "subprocess"):
            assert name not in added, f"{name}: {FRONT_ONLY}"
    finally:
        warm_client.close()
