"""Two clones of one project on CT 200 for the chaos test: A reaches the CT directly (``ct200``), B through a
TCP proxy (``cut``) that the test can kill mid-command. Each clone is its own folder with its own registry.
A runs the installed ``orch`` script, so its commands go through the warm orch process once one listens; B runs
the CLI module itself. Both share one runtime folder, so one connection keeper holds both their connections.

    a, b = make_clones(testbed, workdir, proxy, runtime)
    result = a.start("deploy"); result.wait(90)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = "/workspace/orch"
WORKSPACE = "/workspace"
CKPT = "/workspace/checkpoints"

# quick to start; a checkpoint of random bytes every CHAOS_CKPT_EVERY steps, each under a name no run reuses,
# written beside and renamed (a hidden name while half-written); SIGINT ends it at once
TRAIN = """\
import os, sys, time, uuid
ck = os.environ["ORCH_CHECKPOINT_DIR"]
os.makedirs(ck, exist_ok=True)
steps, every = int(os.environ["CHAOS_STEPS"]), int(os.environ["CHAOS_CKPT_EVERY"])
token = uuid.uuid4().hex[:10]
for step in range(1, steps + 1):
    time.sleep(float(os.environ["CHAOS_SLEEP"]))
    print(f"step={step} total_steps={steps} loss={1 / step:.4f}", flush=True)
    if step % every == 0:
        tmp = os.path.join(ck, f".ckpt-{token}.part")
        with open(tmp, "wb") as fh:
            fh.write(os.urandom(2048))
        os.replace(tmp, os.path.join(ck, f"ckpt-{token}-{step:05d}.pt"))
"""

CONFIG = """\
default_target = "{target}"

[project]
name = "chaos"
sources = ["train.py"]
command = "python3 train.py"
env = {{ CHAOS_STEPS = "{steps}", CHAOS_SLEEP = "0.05", CHAOS_CKPT_EVERY = "20" }}

[paths]
root = "{root}"
checkpoints = "{ckpt}"

[run]
stop_timeout = 5
term_timeout = 3
lock_timeout = 45

[proxmox]
host = "{api.host}"
port = {api.port}
token_id = "{api.token_id}"
verify_ssl = "{api.cert_path}"
timeout = 5
start_timeout = 60
node_ssh = {{ user = "root", host = "{node.address}", port = {node.port} }}

[ssh]
known_hosts = ["{known_hosts}"]
trust_file = "{trusted}"
identity_file = "{key}"
connect_timeout = 5
connect_retries = 1
command_timeout = 60

[targets.ct200]
kind = "proxmox"
ct = 200
access = "ssh"
user = "root"

[targets.cut]
kind = "proxmox"
ct = 200
address = "127.0.0.1"
port = {proxy_port}
"""


@dataclass
class Outcome:
    """One CLI subprocess as the chaos loop saw it."""

    argv: list[str]
    clone: str
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    hung: bool = False
    signalled: str | None = None  # "SIGKILL" / "SIGINT" when the loop sent one
    pid: int = 0  # the CLI process's


@dataclass
class Running:
    proc: subprocess.Popen
    outcome: Outcome
    begin: float = field(default_factory=time.monotonic)

    def signal(self, sig: signal.Signals) -> None:
        """SIGINT to the process group, as a terminal's Ctrl-C; SIGKILL to the CLI process alone."""
        if self.proc.poll() is not None:
            return
        self.outcome.signalled = sig.name
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> Outcome:
        try:
            out, err = self.proc.communicate(timeout=max(0.1, timeout - (time.monotonic() - self.begin)))
        except subprocess.TimeoutExpired:
            self.outcome.hung = True
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, err = self.proc.communicate()
        try:  # whatever the CLI left in its group (it was started in a session of its own)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.outcome.returncode = self.proc.returncode
        self.outcome.stdout, self.outcome.stderr = out, err
        self.outcome.seconds = time.monotonic() - self.begin
        return self.outcome


def orch_script() -> list[str]:
    """The installed ``orch`` (its entry point, which goes through the warm process)."""
    script = Path(sys.executable).with_name("orch")
    return [str(script)] if script.exists() else [sys.executable, "-c", "from orchestrator.main import main; main()"]


class Clone:
    def __init__(self, name: str, path: Path, env: dict[str, str], command: list[str]) -> None:
        self.name, self.path, self.env, self.command = name, path, env, command

    @property
    def db(self) -> Path:
        return self.path / ".orch" / "experiments.db"

    def start(self, *args: str) -> Running:
        argv = [*self.command, *args]
        proc = subprocess.Popen(argv, cwd=self.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, **self.env), start_new_session=True)
        return Running(proc, Outcome(list(args), self.name, pid=proc.pid))

    def run(self, *args: str, timeout: float) -> Outcome:
        return self.start(*args).wait(timeout)

    def registry(self):
        from orchestrator.records.experiments import Registry

        return Registry(self.db)

    def launch_guard(self, exp_id: int) -> str:
        """For a row left ``launching``: whether its launch guard says a launcher is alive, and which processes
        have the guard's lock file open (``records/launch_guard.py``)."""
        from orchestrator.records.launch_guard import _path, launcher_alive

        path = _path(self.path / ".orch", exp_id)
        if not path.exists():
            return "no launch guard file"
        holders = []
        for fd_dir in Path("/proc").glob("[0-9]*/fd"):
            try:
                if any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                    cmdline = (fd_dir.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    holders.append(f"pid {fd_dir.parent.name} `{cmdline[:160]}`")
            except OSError:
                continue
        alive = "held" if launcher_alive(self.path / ".orch", exp_id) else "free"
        return f"launch guard {alive}; open in: {', '.join(holders) or 'no process'}"

    def rows(self) -> tuple[str | None, list]:
        """(registry id, rows); (None, []) before the first command made the registry."""
        if not self.db.exists():
            return None, []
        with self.registry() as reg:
            return reg.registry_id, reg.list()


def make_clones(testbed, workdir: Path, proxy, runtime: Path, steps: int = 400) -> tuple[Clone, Clone]:
    """Clone A (direct, warm) and clone B (through ``proxy``) of project ``chaos``, both on CT 200; their
    keeper and warm process listen in ``runtime``."""
    env = {"ORCH_PROXMOX_TOKEN": testbed.api.token_secret, "ORCH_SSH__READ_TIMEOUT": "5",
           "XDG_RUNTIME_DIR": str(runtime)}
    commands = {"A": orch_script(), "B": [sys.executable, "-m", "orchestrator.cli.main"]}
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    clones = []
    for name, target in (("A", "ct200"), ("B", "cut")):
        path = workdir / f"clone-{name}"
        path.mkdir(parents=True)
        (path / "train.py").write_text(TRAIN)
        known = path / "known_hosts"
        known.write_text(Path(testbed.known_hosts_path).read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")
        (path / "orch.toml").write_text(CONFIG.format(
            target=target, steps=steps, root=ROOT, ckpt=CKPT, api=testbed.api, node=testbed.node,
            known_hosts=known, trusted=path / "trusted_hosts", key=testbed.key_path, proxy_port=proxy.port))
        clones.append(Clone(name, path, env, commands[name]))
    return clones[0], clones[1]
