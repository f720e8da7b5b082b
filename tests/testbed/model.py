"""A model-based test of orch on the testbed: hypothesis's ``RuleBasedStateMachine`` drives one project on CT 200
(over SSH, through the installed ``orch``, so through the warm process and the connection keeper) with actions
that mix the features, and checks the invariants (``model_checks``) after every step.

Actions: ``deploy``, ``restart`` (and ``--clean-checkpoints --yes``), ``deploy --gpus 1 --beside``,
``deploy --queue``, ``deploy --guard``, ``sweep --gpus 1 --steps N``, ``stop`` (bare, ``-e ID``, ``--all``),
``pull --checkpoints``, a graceful or a hard stop of the container (then started again), each CLI call from one of
three shells with different environments (``SHELLS``), and a Ctrl-C to the CLI at a random moment in a quarter of
them. The launches carry a secret (``[project] secrets``; queued and guarded ones and sweeps go without: a queue
never holds secrets, and a rollback restarts a run with none).

    world = World(testbed, workdir)          # the project, the CT pristine
    summary = run(world, steps=12, seed=5)   # a fixed seed: the same actions
    assert not summary.violations, summary.report()
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import chaos_checks, lxc
from . import model_checks as checks
from .chaos_clones import Clone, Outcome, orch_script

ROOT = "/workspace/orch"
WORKSPACE = "/workspace"
CKPT = "/workspace/checkpoints"
SECRET = "mdl-S3CRET-7f1c9a"  # its value must never be at rest on the target
PROJECT = "model"
ACTION_TIMEOUT = 150.0
STATUS_TIMEOUT = 60.0
RESUME_WAIT = 45.0  # s a container's restart is given to resume its run (the run's systemd unit)
CHAOS_PROBE = Path(__file__).with_name("chaos_probe.py")
MODEL_PROBE = Path(__file__).with_name("model_probe.py")
INTERRUPT_RATE = 0.25

# resumes from ORCH_RESUME_FROM, else from the newest checkpoint under its folder (as a script that globs
# ``**/*.pt`` does); prints what it resumed from, who wrote it, and its environment; a checkpoint (naming its
# writer) every 10 steps; runs until it is stopped (a sweep's variants until their budget)
TRAIN = """\
import glob, json, os, signal, sys, time, uuid
WATCHED = %r
ck = os.environ["ORCH_CHECKPOINT_DIR"]
os.makedirs(ck, exist_ok=True)
me = os.environ["ORCH_EXPERIMENT_ID"]
start = os.environ.get("ORCH_RESUME_FROM") or ""
if not start:
    found = sorted(glob.glob(os.path.join(ck, "**", "ckpt-*.pt"), recursive=True), key=os.path.getmtime)
    start = found[-1] if found else ""
writer = None
if start:
    try:
        writer = json.load(open(start))["exp"]
    except (OSError, ValueError, KeyError):
        writer = None
print("model-start " + json.dumps({"exp": me, "resumed": start, "writer": writer,
                                   "env": {k: os.environ.get(k) for k in WATCHED}}), flush=True)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
token = uuid.uuid4().hex[:8]
step = 0
while True:
    step += 1
    time.sleep(0.1)
    print(f"step={step} loss={1 / step:.4f}", flush=True)
    if step %% 10 == 0:
        tmp = os.path.join(ck, f".ckpt-{token}.part")
        with open(tmp, "w") as fh:
            json.dump({"exp": me, "step": step}, fh)
        os.replace(tmp, os.path.join(ck, f"ckpt-{me}-{token}-{step:05d}.pt"))
""" % (checks.WATCHED,)

CONFIG = """\
default_target = "ct200"

[project]
name = "{project}"
sources = ["train.py"]
command = "python3 train.py"
secrets = ["MODEL_SECRET"]
env = {{ MODEL_TAG = "none" }}

[paths]
root = "{root}"
checkpoints = "{ckpt}"

[run]
stop_timeout = 5
term_timeout = 3
lock_timeout = 60
resume_after_reboot = true

[guard]
steps = 10
min_throughput = 0.3

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
gpus = 2
"""

# three shells the CLI is called from: a variable of their own that must never reach a run (LEAK_VAR), a setting
# from the environment that must (ORCH_PROJECT__ENV__SHELL_TAG: [project] env's shell_tag), locales and zones
SHELLS = ({"LEAK_VAR": "from-shell-0", "ORCH_PROJECT__ENV__SHELL_TAG": "s0", "LANG": "C.UTF-8"},
          {"LEAK_VAR": "from-shell-1", "ORCH_PROJECT__ENV__SHELL_TAG": "s1", "LC_ALL": "C", "TZ": "UTC"},
          {"ORCH_PROJECT__ENV__SHELL_TAG": "s2", "TZ": "Europe/Berlin"})

# what a step does, as often as it is listed
ACTIONS = ("deploy", "deploy", "deploy", "restart", "restart-clean", "beside", "beside", "queue", "guard", "sweep",
           "stop latest", "stop latest", "stop one", "stop all", "pull", "shutdown", "kill")


@dataclass
class Violation:
    step: int
    action: str
    what: str

    def __str__(self) -> str:
        return f"step {self.step} ({self.action}): {self.what}"


@dataclass
class Summary:
    seed: int
    steps: int = 0
    actions: dict = field(default_factory=dict)
    exits: dict = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    wall: float = 0.0

    def report(self) -> str:
        return "\n".join(str(v) for v in self.violations) or "no violations"

    def table(self) -> str:
        rows = [("seed", self.seed), ("steps", self.steps), ("wall time (s)", f"{self.wall:.0f}")]
        rows += [(f"action {k}", v) for k, v in sorted(self.actions.items())]
        rows += [(f"CLI exit {k}", v) for k, v in sorted(self.exits.items(), key=lambda kv: str(kv[0]))]
        rows += [("violations", len(self.violations))]
        return "\n".join(f"{label:28} {value:>8}" for label, value in rows)


class World:
    """The project's clone on this machine, CT 200, and what the model knows of each launch."""

    def __init__(self, testbed, workdir: Path) -> None:
        self.testbed, self.workdir = testbed, workdir
        self.ct = testbed.ct(200)
        path = workdir / "clone"
        path.mkdir(parents=True)
        (path / "train.py").write_text(TRAIN)
        (path / "orch.toml").write_text(CONFIG.format(
            project=PROJECT, root=ROOT, ckpt=CKPT, api=testbed.api, node=testbed.node,
            known_hosts=testbed.known_hosts_path, trusted=path / "trusted_hosts", key=testbed.key_path))
        runtime = workdir / "rt"
        runtime.mkdir(mode=0o700)
        env = {"ORCH_PROXMOX_TOKEN": testbed.api.token_secret, "ORCH_SSH__READ_TIMEOUT": "5",
               "XDG_RUNTIME_DIR": str(runtime), "MODEL_SECRET": SECRET}
        self.clone = Clone("M", path, env, orch_script())
        self.launched: dict[int, dict] = {}  # experiment id -> the MODEL_TAG and shell_tag its launch was given
        self.seen: dict[str, str] = {}  # every checkpoint file seen: path -> sha256
        self.tags = 0
        self.before = self.probe()
        self.remember(self.before)

    def close(self) -> None:
        from orchestrator.reach.keeper import client
        from orchestrator.warm import client as warm_client

        saved = os.environ.get("XDG_RUNTIME_DIR")
        os.environ["XDG_RUNTIME_DIR"] = self.clone.env["XDG_RUNTIME_DIR"]
        try:
            warm_client.close(everyone=True)
            client.close(None, everyone=True)
        finally:
            if saved is None:
                os.environ.pop("XDG_RUNTIME_DIR", None)
            else:
                os.environ["XDG_RUNTIME_DIR"] = saved

    # -- talking to the target ------------------------------------------------------------------------------

    def probe(self) -> dict:
        """chaos_probe's answer (runs, files, under the target's lock) and model_probe's (launch envs, starts)."""
        if self.ct.state() != "RUNNING":
            return {"lock_wait": None, "runs": {}, "files": {}, "model": {"runs": {}, "secret_in": [], "queued": 0}}
        first = json.loads(self.ct.attach("python3", "-", ROOT, WORKSPACE, input=CHAOS_PROBE.read_bytes()).stdout)
        first["model"] = json.loads(self.ct.attach("python3", "-", ROOT, SECRET,
                                                   input=MODEL_PROBE.read_bytes()).stdout)
        return first

    def remember(self, probe: dict) -> None:
        if probe.get("lock_wait") is not None:
            self.seen.update(chaos_checks.checkpoint_folder_files(probe))

    def cli(self, argv: list[str], shell: int, interrupt: float | None, extra: dict | None = None) -> Outcome:
        """One CLI call from shell ``shell``; with ``interrupt``, a Ctrl-C that many seconds in."""
        saved = self.clone.env
        self.clone.env = {**saved, **SHELLS[shell], **(extra or {})}
        try:
            running = self.clone.start(*argv)
        finally:
            self.clone.env = saved
        timer = threading.Timer(interrupt, running.signal, args=(signal.SIGINT,)) if interrupt else None
        if timer:
            timer.start()
        try:
            return running.wait(ACTION_TIMEOUT)
        finally:
            if timer:
                timer.cancel()

    def registry(self) -> tuple[str | None, dict[int, int | None]]:
        """(registry id, parent of each experiment)."""
        if not self.clone.db.exists():
            return None, {}
        with self.clone.registry() as reg:
            return reg.registry_id, {e.id: e.parent for e in reg.list(limit=10_000)}

    # -- the steps ------------------------------------------------------------------------------------------

    def launch(self, kind: str, shell: int, interrupt: float | None) -> list[Outcome]:
        self.tags += 1
        tag = f"t{self.tags}"
        words = {"deploy": ["deploy"], "restart": ["restart"], "restart-clean": ["restart", "--clean-checkpoints",
                                                                                   "--yes"],
                 "beside": ["deploy", "--gpus", "1", "--beside"], "queue": ["deploy", "--queue"],
                 "guard": ["deploy", "--guard", "--yes"],  # it moves the parent's checkpoints aside: confirmed
                 "sweep": ["sweep", "--set", f"project.env.MODEL_TAG={tag}a,{tag}b", "--gpus", "1", "--steps", "25"]}
        argv = [*words[kind], "--json"]
        extra = {}
        if kind in ("deploy", "beside", "queue", "guard"):
            argv += ["--set", f"project.env.MODEL_TAG={tag}", "-m", f"{kind} {tag}"]
        if kind in ("queue", "sweep", "guard"):  # a queued run, or one a rollback restarts, carries no secrets
            extra["ORCH_PROJECT__SECRETS"] = "[]"
        outcome = self.cli(argv, shell, interrupt, extra)
        if outcome.returncode == 0 and kind in ("deploy", "beside", "queue", "guard"):
            try:
                exp_id = json.loads(outcome.stdout)["experiment"]["id"]
            except (ValueError, KeyError, TypeError):
                exp_id = None
            if exp_id is not None:
                self.launched[int(exp_id)] = {"MODEL_TAG": tag,
                                              "shell_tag": SHELLS[shell]["ORCH_PROJECT__ENV__SHELL_TAG"]}
        return [outcome]

    def stop(self, which: str, pick: int, shell: int, interrupt: float | None) -> list[Outcome]:
        registry_id, _ = self.registry()
        live = sorted(checks.live_ids(self.before, registry_id))
        argv = {"latest": ["stop"], "all": ["stop", "--all"]}.get(which) or \
            (["stop", "-e", str(live[pick % len(live)])] if live else ["stop"])
        return [self.cli(argv, shell, interrupt)]

    def pull(self, shell: int) -> tuple[list[Outcome], list[str]]:
        """``orch pull --checkpoints`` of the latest experiment; what it brought must be of that run's lineage."""
        registry_id, parents = self.registry()
        if not parents:
            return [], []
        exp_id = max(parents)
        dest = self.workdir / f"pull-{exp_id}-{time.monotonic_ns()}"
        outcome = self.cli(["pull", "-e", str(exp_id), "--checkpoints", "--to", str(dest)], shell, None)
        problems = []
        runs = self.before["model"]["runs"]
        folder_of = {int(k.rsplit("-", 1)[1]): r["env"].get("ORCH_CHECKPOINT_DIR") for k, r in runs.items()
                     if registry_id and k.startswith(registry_id + "-")}
        allowed = {exp_id} | checks.ancestors(exp_id, parents) | \
            {e for e, f in folder_of.items() if f and f == folder_of.get(exp_id)}
        for path in dest.rglob("*.pt") if outcome.returncode == 0 else []:
            try:
                writer = int(json.loads(path.read_text())["exp"])
            except (OSError, ValueError, KeyError):
                continue
            if writer not in allowed:
                problems.append(f"orch pull -e {exp_id} --checkpoints brought {path.relative_to(dest)}, written by "
                                f"experiment {writer}, not of its lineage")
        return [outcome], problems

    def container(self, how: str) -> None:
        """The container stopped (``pct shutdown``'s graceful stop, or killed) and started again; its runs are
        given ``RESUME_WAIT`` s to be resumed by their units."""
        registry_id, _ = self.registry()
        had = checks.live_ids(self.before, registry_id)
        if how == "shutdown":
            self.ct.shutdown(timeout=20)
        else:
            self.ct.stop()
        self.ct.start(timeout=60)
        lxc.wait_port(self.ct.address, self.ct.port, timeout=30)
        deadline = time.monotonic() + RESUME_WAIT
        while had and time.monotonic() < deadline:
            if checks.live_ids(self.probe(), registry_id):
                break
            time.sleep(1.0)

    # -- the invariants -------------------------------------------------------------------------------------

    def check(self, action: str, outcomes: list[Outcome], stopped_by_user: bool) -> list[str]:
        found = []
        for outcome in outcomes:
            found += chaos_checks.clean_output(outcome, ACTION_TIMEOUT)
        # a bare stop or -e starts what was queued behind; --all empties the queue too
        queued_before = self.before["model"].get("queued", 0) > 0 and "stop all" not in action
        status = self.clone.run("status", "--json", "--no-metrics", timeout=STATUS_TIMEOUT)
        listed = self.clone.run("experiments", "list", "--json", "--limit", "10000", timeout=STATUS_TIMEOUT)
        found += chaos_checks.clean_output(status, STATUS_TIMEOUT) + chaos_checks.clean_output(listed, STATUS_TIMEOUT)
        after = self.probe()
        if after.get("lock_wait") is None:
            return found + ["the target's lock was still held 30 s after the step"]
        registry_id, parents = self.registry()
        model = after["model"]
        mine = {k: r for k, r in model["runs"].items() if registry_id and k.startswith(registry_id + "-")}
        found += checks.lineage(mine, parents)
        found += checks.environments(mine, self.launched)
        exempt = {int(k.rsplit("-", 1)[1]) for k, r in mine.items() if r["env"].get("ORCH_MAX_STEPS")
                  or (action.startswith("container") and r.get("secrets"))}  # a run's secrets never survive a reboot
        found += checks.holds_a_run(checks.live_ids(self.before, registry_id), checks.live_ids(after, registry_id),
                                    stopped_by_user, queued_before, exempt)
        try:
            rows = json.loads(listed.stdout) if listed.returncode == 0 else None
            shown = json.loads(status.stdout) if status.returncode == 0 else None
        except ValueError:
            rows, shown = None, None
        if rows is not None:
            found += checks.records(rows, shown, self.before, after, registry_id)
        found += checks.no_secret(model["secret_in"])
        found += checks.kept(self.seen, after["files"])
        for what in found:  # a lost checkpoint is said once
            if what.startswith("checkpoint "):
                self.seen.pop(what.split()[1], None)
        self.remember(after)
        self.before = after
        return found


def make_machine(world: World, summary: Summary, budget: int):
    """The ``RuleBasedStateMachine`` over ``world``: each rule one step, every invariant checked after it, what
    broke collected in ``summary`` (the test fails on them at the end, with every step's report).

    The world is real and outlives each of hypothesis's examples: they are consecutive stretches of one history
    (each as long as the whole budget may be, so that hypothesis's mutations of an earlier example repeat little)
    until ``budget`` steps were taken (a rule then does nothing). The choices depend on the seed alone, never on
    the world (no precondition reads it), as hypothesis requires; the simplest example, which hypothesis tries
    first, is ``pause`` alone (the rule with no arguments), and changes nothing."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule

    shells = st.integers(0, len(SHELLS) - 1)
    spent = lambda: summary.steps >= budget  # noqa: E731
    reported: set[str] = set()

    class Model(RuleBasedStateMachine):
        def _step(self, action: str, outcomes: list[Outcome], stopped: bool, extra: list[str] | None = None) -> None:
            summary.steps += 1
            summary.actions[action.split(" ^C")[0]] = summary.actions.get(action.split(" ^C")[0], 0) + 1
            for o in outcomes:
                summary.exits[o.returncode] = summary.exits.get(o.returncode, 0) + 1
            found = (extra or []) + world.check(action, outcomes, stopped)
            said = f"{action}: exit {','.join(str(o.returncode) for o in outcomes) or '-'}"
            errors = [ln for o in outcomes for ln in o.stderr.splitlines() if ln.startswith("error: ")]
            print(f"step {summary.steps:3}: {said:40} {len(found)} problem(s)"
                  + (f"  [{errors[0][:150]}]" if errors else ""), flush=True)
            for what in found:
                print(f"          {what}", flush=True)
                if what not in reported:  # one that lasts is said once, at the step it began
                    reported.add(what)
                    summary.violations.append(Violation(summary.steps, action, what))

        @rule()
        def pause(self):
            """Nothing: the simplest example's every step, and now and then a breath between two others."""

        @rule(action=st.sampled_from(ACTIONS), shell=shells, pick=st.integers(0, 7), chance=st.floats(0, 1),
              delay=st.floats(0.05, 4.0))
        def act(self, action, shell, pick, chance, delay):
            if spent():
                return
            interrupt = delay if chance < INTERRUPT_RATE and action not in ("pull", "shutdown", "kill") else None
            said = action + (f" ^C@{delay:.2f}s" if interrupt else "")
            if action in ("shutdown", "kill"):
                world.container(action)
                self._step(f"container {said}", [], False)
            elif action == "pull":
                outcomes, problems = world.pull(shell)
                self._step(said, outcomes, False, problems)
            elif action.startswith("stop"):
                self._step(said, world.stop(action.split()[1], pick, shell, interrupt), True)
            else:
                self._step(said, world.launch(action, shell, interrupt), False)

    return Model


def run(world: World, steps: int, seed: int) -> Summary:
    """One sequence of ``steps`` steps chosen by hypothesis from ``seed`` (no shrinking: each step is real)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as fixed_seed
    from hypothesis.stateful import run_state_machine_as_test

    summary = Summary(seed)
    machine = fixed_seed(seed)(make_machine(world, summary, steps))
    begin = time.monotonic()
    run_state_machine_as_test(machine, settings=settings(
        max_examples=4 * steps + 20, stateful_step_count=steps, deadline=None, phases=[Phase.generate],
        database=None, suppress_health_check=list(HealthCheck), print_blob=False))
    summary.wall = time.monotonic() - begin
    return summary
