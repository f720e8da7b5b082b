"""``[project] secrets`` on the local target, through the real CLI as a subprocess.

A random value is searched for, byte for byte, everywhere orch could have put it: the registry (and its
WAL), every file under the target root, everything orch printed, and every process's command line. It
must be found only in the run's environment, which the run proves by printing the value's hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

from tests.cli.test_lifecycle import wait_status
from tests.waits import wait_for

WATCHER = """\
import hashlib, os, time
for name in ("WANDB_API_KEY", "HF_TOKEN"):
    print(name, hashlib.sha256(os.environ[name].encode()).hexdigest(), flush=True)
end = time.time() + 120
while time.time() < end:
    print("step=1 loss=1.0", flush=True)
    time.sleep(0.2)
"""


def configure(project, extra_env: str = "") -> None:
    (project.path / "watch.py").write_text(WATCHER)
    project.configure()
    path = project.path / "orch.toml"
    lines = [line for line in path.read_text().splitlines() if not line.startswith(("sources =", "command =", "env ="))]
    at = lines.index('name = "tinylm"') + 1
    lines[at:at] = ['sources = ["watch.py"]', 'command = "python3 watch.py"',
                    'secrets = ["WANDB_API_KEY", "HF_TOKEN"]', f'env = {{ OMP_NUM_THREADS = "1"{extra_env} }}']
    path.write_text("\n".join(lines) + "\n")


def write_secrets_file(project, text: str, mode: int = 0o600) -> Path:
    path = project.path / ".orch" / "secrets.env"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def every_cmdline() -> list[bytes]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out.append(Path(f"/proc/{entry}/cmdline").read_bytes())
            except OSError:
                pass
    return out


def files_under(*folders: Path) -> dict[str, bytes]:
    out = {}
    for folder in folders:
        for p in folder.rglob("*"):
            if p.is_file() and not p.is_symlink():
                out[str(p)] = p.read_bytes()
    return out


def test_secrets_reach_only_the_runs_environment(project):
    configure(project)
    key, token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    write_secrets_file(project, f"# comment\nexport HF_TOKEN='{token}'\nWANDB_API_KEY=from-the-file\n")
    env = {"WANDB_API_KEY": key}  # the environment wins over the file
    outputs: list[str] = []

    def orch(*args: str):
        res = project.run(*args, env=env)
        outputs.extend([res.stdout, res.stderr])
        assert res.returncode == 0, res.stderr
        return res

    orch("deploy", "-m", "first")
    wait_status(project, 1, ("running",))
    run_dir = project.run_dir(1)
    # step 1 comes after both hashes (orch's own line names them first)
    wait_for(lambda: "step=1" in (run_dir / "train.log").read_text(), 30, "the run's secrets' hashes")
    cmdlines = every_cmdline()  # while the run, its supervisor and tmux are alive
    log = (run_dir / "train.log").read_text()
    assert f"WANDB_API_KEY {hashlib.sha256(key.encode()).hexdigest()}" in log
    assert f"HF_TOKEN {hashlib.sha256(token.encode()).hexdigest()}" in log
    assert "orch: secrets in the environment: HF_TOKEN, WANDB_API_KEY" in log
    assert not (run_dir / "secrets.pipe").exists()
    # in the run's own environment, and not in its supervisor's (so not in tmux's either)
    pids = json.loads((run_dir / "pid.json").read_text())
    child_env = Path(f"/proc/{pids['child']}/environ").read_bytes()
    assert key.encode() in child_env and token.encode() in child_env
    assert token.encode() not in Path(f"/proc/{pids['supervisor']}/environ").read_bytes()
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"] and "HF_TOKEN" not in launch["env"]
    # a restart hands them to its run again; show, list and compare name them
    orch("restart", "-m", "second")
    wait_status(project, 2, ("running",))
    wait_for(lambda: "step=1" in (project.run_dir(2) / "train.log").read_text(), 30, "the restart's first step")
    cmdlines += every_cmdline()
    show = json.loads(orch("experiments", "show", "2", "--json").stdout)
    assert show["secrets"] == ["WANDB_API_KEY", "HF_TOKEN"]
    assert "secrets      WANDB_API_KEY, HF_TOKEN" in orch("experiments", "show", "1").stdout
    orch("experiments", "list")
    orch("experiments", "compare", "1", "2", "--no-refresh")
    orch("status")
    orch("logs", "-n", "50")
    orch("stop")
    stored = files_under(project.root, project.path / ".orch")
    stored.pop(str(project.path / ".orch" / "secrets.env"))  # the user's own file
    for value in (key, token):
        needle = value.encode()
        assert not [path for path, data in stored.items() if needle in data]
        assert not [text for text in outputs if value in text]
        assert not [c for c in cmdlines if needle in c]
    assert "from-the-file" not in "".join(outputs)


def test_a_missing_secret_stops_the_deploy_before_anything_changes(project):
    configure(project)
    res = project.run("deploy", env={"WANDB_API_KEY": "k"})
    assert res.returncode == 2
    assert "HF_TOKEN" in res.stderr and "environment" in res.stderr and "secrets.env" in res.stderr
    assert not project.root.exists() and not (project.path / ".orch" / "experiments.db").exists()


def test_a_secrets_file_others_can_read_is_refused(project):
    configure(project)
    path = write_secrets_file(project, "HF_TOKEN=hunter2-token\n", mode=0o640)
    res = project.run("deploy", env={"WANDB_API_KEY": "k"})
    assert res.returncode == 2
    assert str(path) in res.stderr and "chmod 600" in res.stderr and "hunter2" not in res.stderr
    assert not project.root.exists()
    path.chmod(0o600)
    path.write_text("HF_TOKEN hunter2-token\n")  # malformed: the error names the line, never its content
    res = project.run("deploy", env={"WANDB_API_KEY": "k"})
    assert res.returncode == 2 and "line 1" in res.stderr and "hunter2" not in res.stderr


def test_env_keys_that_look_secret_are_warned_about_once(project):
    configure(project, extra_env=', OPENAI_API_KEY = "sk-recorded", DB_PASSWORD = "pw"')
    res = project.run("deploy", env={"WANDB_API_KEY": "k", "HF_TOKEN": "t"})
    assert res.returncode == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: [project] env")]
    assert len(warnings) == 1 and "OPENAI_API_KEY, DB_PASSWORD" in warnings[0] and "sk-recorded" not in res.stderr
    assert "OMP_NUM_THREADS" not in warnings[0]
    project.run("stop")
