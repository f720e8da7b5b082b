"""A seeded chaos loop over the real testbed: two clones of one project on CT 200 and a third clone, J, of another
project whose 2-node job runs over CTs 200 and 201 (``chaos_jobs``), one action per cycle through the real CLI, a
random fault in about three quarters of the cycles, and the invariants checked after every cycle.

    chaos = Chaos(testbed, workdir, seed=7)
    summary = chaos.run(cycles=20)
    print(summary.table()); assert not summary.violations, summary.report()

A cycle: pick a clone and an action (``deploy``, ``restart --clean-checkpoints --yes``, ``stop``; or ``job``: J
deploys its job over both CTs, restarts it with ``--clean-checkpoints --yes`` or stops it, its first a deploy, with
maybe a fault of CT 200's below or ``node-freeze``/``node-cut``: node 1's CT frozen, or its link down), maybe a
fault (``cut`` the proxied clone's connection mid-command, ``freeze`` the CT for a moment, ``sshd`` down in the
CT for a moment, ``sigkill`` or ``sigint`` the CLI at a random moment (a third of the SIGINTs within 0.3 s,
Python still starting), a ``race``: the other clone deploys at the same time, ``full``: the CT's workspace filled
to 100%, see ``chaos_disk``, and while it is still full the remedies ``checkpoints list`` and ``checkpoints purge``
of the oldest trash entry must work, as must a ``stop``; ``keeper``,
``agent``, ``warm``: SIGKILL of the connection keeper, of the resident agents in the CT, of the warm orch process
and the command it runs (clone A's commands go through it); ``slow``/``lossy``: CT 200's link through a token bucket
for the whole action, ``lossy`` with a queue so short that it drops; ``orch-full``: the clone's own ``.orch``, a
small filesystem of its own, filled to 100%, and while it is full ``status`` and ``stop`` must work; ``locked``:
another process holds a write transaction on the clone's registry for a few seconds, less than orch waits;
``locked-long``: longer, so that a command that must write fails with an error naming the holder); run it; heal;
probe the targets; ``orch status`` once from each clone (J's once it launched a job); probe again; check
(``chaos_checks``). The same seed gives the same choices and delays (what the target does with them still depends
on timing).
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import chaos_checks as checks
from . import chaos_disk, chaos_jobs, lxc, torchsite
from . import chaos_faults as faults
from .chaos_clones import ROOT, WORKSPACE, Clone, Outcome, make_clones

ACTIONS = {"deploy": ["deploy"], "restart": ["restart", "--clean-checkpoints", "--yes"], "stop": ["stop"]}
WEIGHTS = {"deploy": 5, "restart": 3, "stop": 2, "job": 2}  # job: clone J's 2-node job (``chaos_jobs``)
JOB_WEIGHTS = {"deploy": 1, "restart": 1, "stop": 1}  # after J's first, which is a deploy
FAULT_WEIGHTS = {"cut": 1, "freeze": 1, "sshd": 1, "sigkill": 1, "sigint": 1, "race": 1, "full": 1,
                 "keeper": 1, "agent": 1, "warm": 1, "slow": 1, "lossy": 1, "orch-full": 1, "locked": 1,
                 "locked-long": 0.5}  # each long lock costs the cycle the registry's whole 30 s wait
FAULTS = tuple(FAULT_WEIGHTS)
# a job action meets the faults of CT 200 (its node 0) and of the command, and the two of its node 1 (CT 201)
JOB_FAULT_WEIGHTS = {"node-freeze": 2, "node-cut": 2, "freeze": 1, "sshd": 1, "sigkill": 1, "sigint": 1,
                     "agent": 1, "keeper": 1, "slow": 1}
FAULT_RATE = 0.75  # of the cycles
STRIKES = ("cut", "freeze", "sshd", "sigkill", "sigint", "full", "keeper", "agent", "warm", "orch-full",
           *chaos_jobs.NODE_FAULTS)
LATENCY = {"slow": "20ms", "lossy": "1ms"}
# these strike at a quarter of the delay (within 0.75 s): a command through the keeper or the warm process is quick.
# Not sigint: a third of them strike within orch's first 0.3 s (Python still starting), the rest at the delay;
# nor the node faults: a job's launch reaches node 1 after node 0's start
QUICK = tuple(f for f in STRIKES if f != "sigint" and f not in chaos_jobs.NODE_FAULTS)
EARLY_SIGINT = 1 / 3
LOCK_LONG = 34.0  # s: past the registry's 30 s wait
ACTION_TIMEOUT = 120.0  # s: a CLI call still going after this counts as hung
STATUS_TIMEOUT = 60.0
PROBE = Path(__file__).with_name("chaos_probe.py")


@dataclass
class Violation:
    seed: int
    cycle: int
    action: str
    clone: str
    fault: str | None
    what: str

    def __str__(self) -> str:
        return (f"seed {self.seed} cycle {self.cycle}: {self.action} from clone {self.clone}, "
                f"fault {self.fault or 'none'}: {self.what}")


@dataclass
class Summary:
    seed: int
    cycles: int = 0
    actions: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    landed: Counter = field(default_factory=Counter)  # faults that struck while the CLI call was still running
    exits: Counter = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    checkpoints_seen: int = 0
    remedies: int = 0  # CLI calls made on a full disk after the action (checkpoints list, purge; status, stop)
    wall: float = 0.0

    def table(self) -> str:
        rows = [("seed", self.seed), ("cycles", self.cycles), ("wall time (s)", f"{self.wall:.0f}"),
                ("s per cycle", f"{self.wall / max(1, self.cycles):.1f}")]
        rows += [(f"action {k}", v) for k, v in sorted(self.actions.items())]
        rows += [(f"fault {k} (mid-command)", f"{v} ({self.landed[k]})") for k, v in sorted(self.faults.items())]
        rows += [(f"CLI exit {k}", v) for k, v in sorted(self.exits.items(), key=lambda kv: str(kv[0]))]
        rows += [("remedies on a full disk", self.remedies), ("checkpoint files tracked", self.checkpoints_seen),
                 ("violations", len(self.violations))]
        return "\n".join(f"{label:28} {value:>8}" for label, value in rows)

    def report(self) -> str:
        return "\n".join(str(v) for v in self.violations) or "no violations"


@dataclass
class Plan:
    clone: Clone
    action: str
    fault: str | None
    delay: float  # s after the start when the fault strikes
    length: float  # s a freeze lasts; a short registry lock lasts twice that
    argv: list[str] = field(default_factory=list)  # the action's CLI words


class Chaos:
    def __init__(self, testbed, workdir: Path, seed: int, steps: int = 400) -> None:
        self.testbed, self.seed, self.rng = testbed, seed, random.Random(seed)
        self.proxy = testbed.proxy("10.77.0.200", 22)
        self.runtime = faults.Runtime.make()
        self.a, self.b = make_clones(testbed, workdir, self.proxy, self.runtime.path, steps=steps)
        self.j = chaos_jobs.make_job_clone(testbed, workdir, self.runtime.path)
        self.job_planned = self.job_started = False  # a job action planned; one run (J's rows and CT 201 matter)
        self.site = torchsite.ensure_site()
        for vmid in chaos_jobs.NODES:  # torch in both CTs: each restarts, before the workspace is made small
            torchsite.mount(testbed.ct(vmid), self.site)
        self.seen: dict[str, str] = {}  # every checkpoint file seen in the folder: path -> sha256
        self.summary = Summary(seed)
        self._reported: set[str] = set()
        self.full = False  # the workspace's filesystem is filled
        self.remedies: list[Outcome] = []  # the CLI calls made on the full disk, after the action
        self.orch_full: Clone | None = None  # the clone whose .orch is filled
        self.holder: faults.Holder | None = None
        self.held_by: int | None = None  # the pid holding the registry this cycle
        self.killed: list[str] = []  # what a keeper or warm fault killed: the evidence if the command fails oddly
        chaos_disk.small_workspace(testbed.ct(200))
        try:
            for clone in (self.a, self.b):
                faults.small_folder(clone.path / ".orch")
            for clone in (self.a, self.b):  # the registries exist, and A's warm process starts
                first = clone.run("status", "--no-metrics", timeout=STATUS_TIMEOUT)
                if first.returncode != 0:
                    raise RuntimeError(f"clone {clone.name}'s first status failed: {first.stderr}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Undo what the loop set up on this machine (its folders' file systems, its keeper and warm process)."""
        self.heal()
        for clone in (self.a, self.b):
            faults.unmount(clone.path / ".orch")
        for vmid in chaos_jobs.NODES:
            torchsite.unmount(self.testbed.ct(vmid), self.site)
        self.runtime.close()

    def __enter__(self) -> "Chaos":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, cycles: int, log=None) -> Summary:
        begin = time.monotonic()
        self._remember(self.probe())
        for n in range(1, cycles + 1):
            plan = self.plan()
            started = time.monotonic()
            found, exits = self.cycle(plan)
            self.summary.cycles = n
            for what in found:
                if what not in self._reported:
                    self._reported.add(what)
                    self.summary.violations.append(
                        Violation(self.seed, n, plan.action, plan.clone.name, plan.fault, what))
            if log:
                log(f"cycle {n:3}: {plan.action:8} from {plan.clone.name}, fault {plan.fault or '-':8} "
                    f"exit {','.join(map(str, exits)):8} {time.monotonic() - started:5.1f} s  "
                    f"{len(found)} problem(s)")
        self.summary.wall = time.monotonic() - begin
        self.summary.checkpoints_seen = len(self.seen)
        return self.summary

    def plan(self) -> Plan:
        rng = self.rng
        action = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        if action == "job":
            sub = rng.choices(list(JOB_WEIGHTS), weights=list(JOB_WEIGHTS.values()))[0] if self.job_planned \
                else "deploy"
            self.job_planned = True
            fault = rng.choices(list(JOB_FAULT_WEIGHTS), weights=list(JOB_FAULT_WEIGHTS.values()))[0] \
                if rng.random() < FAULT_RATE else None
            action, clone, argv = f"job-{sub}", self.j, chaos_jobs.JOB_ACTIONS[sub]
        else:
            fault = rng.choices(FAULTS, weights=list(FAULT_WEIGHTS.values()))[0] if rng.random() < FAULT_RATE \
                else None
            clone = self.b if fault == "cut" else self.a if fault == "warm" else rng.choice((self.a, self.b))
            argv = ACTIONS[action]
        delay = rng.uniform(0.3, 3.0)
        if fault == "sigint" and rng.random() < EARLY_SIGINT:
            delay = rng.uniform(0.05, 0.3)
        return Plan(clone, action, fault, delay=delay, length=rng.uniform(0.5, 4.0), argv=argv)

    def cycle(self, plan: Plan) -> tuple[list[str], list[int | None]]:
        """Run one planned cycle; what broke, and the exit codes of the action's CLI calls."""
        self.summary.actions[plan.action] += 1
        if plan.fault:
            self.summary.faults[plan.fault] += 1
        self.remedies = []
        outcomes = self.act(plan)
        self.heal()
        found, exits = [], [o.returncode for o in outcomes]
        for outcome in outcomes:
            self.summary.exits[outcome.returncode] += 1
            found += [f"{what} (the CLI was pid {outcome.pid}; the fault killed: {'; '.join(self.killed) or 'nothing'};"
                      f" logs: {self.runtime.logs()})" if plan.fault in ("keeper", "warm") else what
                      for what in checks.clean_output(outcome, ACTION_TIMEOUT)]
        if plan.fault == "full" and plan.action == "stop":
            found += checks.succeeded(outcomes[:1], "on a full disk")
        if plan.fault == "locked-long":
            found += checks.names_holder(outcomes[0], self.held_by)
        found += checks.succeeded(self.remedies, "on a full disk")
        for outcome in self.remedies:
            self.summary.remedies += 1
            found += checks.clean_output(outcome, STATUS_TIMEOUT)
        nodes = chaos_jobs.NODES if self.job_started else (200,)
        before = {vmid: self.probe(vmid) for vmid in nodes}
        for clone, args in self.statuses():
            status = clone.run(*args, timeout=STATUS_TIMEOUT)
            found += checks.clean_output(status, STATUS_TIMEOUT)
        after = {vmid: self.probe(vmid) for vmid in nodes}
        for vmid in nodes:
            if before[vmid].get("lock_wait") is None or after[vmid].get("lock_wait") is None:
                found.append(f"CT {vmid}'s lock was still held 30 s after the cycle")
                return found, exits
        for clone in (self.a, self.b):
            registry_id, rows = clone.rows()
            broken = checks.rows_agree(clone.name, registry_id, rows, before[200], after[200])
            found += [f"{what}; {clone.launch_guard(int(what.split()[3]))}" if " is launching " in what else what
                      for what in broken]  # who still launches it, if anyone: where to look first
        if self.job_started:
            registry_id, rows = self.j.rows()
            found += chaos_jobs.job_rows_agree(self.j.name, registry_id, rows, before, after)
        found += checks.checkpoints_kept(self.seen, after[200])
        for vmid in nodes:
            found += checks.target_tidy(before[vmid], after[vmid])
        for what in found:  # a lost checkpoint is reported once, not again every cycle
            if what.startswith("checkpoint "):
                self.seen.pop(what.split()[1], None)
        self._remember(before[200])
        self._remember(after[200])
        return found, exits

    def statuses(self) -> list[tuple[Clone, tuple[str, ...]]]:
        """The ``orch status`` calls after each cycle: every clone's, J's once it has launched a job."""
        calls = [(clone, ("status", "--no-metrics")) for clone in (self.a, self.b)]
        if self.job_started:
            calls.append((self.j, ("status", "--no-metrics", *chaos_jobs.FLAGS)))
        return calls

    def act(self, plan: Plan) -> list[Outcome]:
        """Run the action with its fault; the outcomes of every CLI call the cycle made."""
        self.held_by = None
        self.killed = []
        if plan.fault in LATENCY:
            faults.shape(200, LATENCY[plan.fault])
            self.summary.landed[plan.fault] += 1
        elif plan.fault in ("locked", "locked-long"):
            self.holder = faults.Holder(plan.clone.db, LOCK_LONG if plan.fault == "locked-long" else 2 * plan.length)
            self.held_by = self.holder.pid
            self.summary.landed[plan.fault] += 1
        running = [plan.clone.start(*plan.argv)]
        if plan.clone is self.j:
            self.job_started = True
        if plan.fault == "race":
            other = self.a if plan.clone is self.b else self.b
            running.append(other.start(*ACTIONS["deploy"]))
            self.summary.landed["race"] += 1
        delay = plan.delay / 4 if plan.fault in QUICK else plan.delay
        strike = threading.Timer(delay, self.strike, args=(plan, running[0]))
        if plan.fault in STRIKES:
            strike.start()
        try:
            outcomes = [r.wait(ACTION_TIMEOUT) for r in running]
        finally:
            strike.cancel()
            if strike.is_alive():
                strike.join()
        if plan.fault == "full":
            if not self.full:  # the action ended before the disk filled: the remedies still meet a full disk
                self.fill()
            self.remedy(plan.clone)
        elif plan.fault == "orch-full":
            if self.orch_full is None:
                self.fill_orch(plan.clone)
            for args in (("status", "--no-metrics"), ("stop",)):
                self.remedies.append(plan.clone.run(*args, timeout=STATUS_TIMEOUT))
        return outcomes

    def fill_orch(self, clone: Clone) -> None:
        self.orch_full = clone
        left = faults.fill(clone.path / ".orch")
        if left > 0:
            raise RuntimeError(f"clone {clone.name}'s .orch still has {left} bytes free after filling it")

    def fill(self) -> None:
        self.full = True
        left = chaos_disk.fill(self.testbed.ct(200))
        if left > 64 << 10:
            raise RuntimeError(f"the CT's workspace still has {left} bytes free after filling it")

    def remedy(self, clone: Clone) -> None:
        """On the full disk: list the checkpoints, purge the oldest trash entry (its files are no longer tracked)."""
        listed = clone.run("checkpoints", "list", "--json", timeout=STATUS_TIMEOUT)
        self.remedies.append(listed)
        if listed.returncode != 0:
            return
        entries = sorted(json.loads(listed.stdout).get("entries") or [], key=lambda e: e.get("created") or 0)
        if not entries:
            return
        name = entries[0]["name"]
        held = {(p.rsplit("/", 1)[1], sha) for p, sha in self.probe()["files"].items() if f"/{name}/" in p}
        purged = clone.run("checkpoints", "purge", name, "--yes", timeout=STATUS_TIMEOUT)
        self.remedies.append(purged)
        if purged.returncode == 0:
            self.seen = {p: sha for p, sha in self.seen.items() if (p.rsplit("/", 1)[1], sha) not in held}

    def strike(self, plan: Plan, target) -> None:
        if target.proc.poll() is None and plan.fault not in ("keeper", "warm"):
            self.summary.landed[plan.fault] += 1
        if plan.fault == "cut":
            self.proxy.stall()
            time.sleep(min(plan.length, 1.0))
            self.proxy.kill()
        elif plan.fault == "freeze":
            ct = self.testbed.ct(200)
            ct.freeze()
            try:
                time.sleep(plan.length)
            finally:
                ct.thaw()
        elif plan.fault == "sshd":
            ct = self.testbed.ct(200)
            ct.kill_sshd()  # new connections are refused; open ones keep their own sshd process
            try:
                time.sleep(plan.length)
            finally:
                self.start_sshd()
        elif plan.fault == "sigkill":
            target.signal(signal.SIGKILL)
        elif plan.fault == "sigint":
            target.signal(signal.SIGINT)
        elif plan.fault == "full":
            self.fill()  # and full it stays until heal(), after the remedies
        elif plan.fault in ("keeper", "warm"):
            running = target.proc.poll() is None
            self.killed = self.runtime.kill(plan.fault)
            if self.killed and running:
                self.summary.landed[plan.fault] += 1
        elif plan.fault == "agent":
            faults.kill_agents(self.testbed.ct(200))
        elif plan.fault == "orch-full":
            self.fill_orch(plan.clone)  # full until heal(), after status and stop
        elif plan.fault in chaos_jobs.NODE_FAULTS:
            chaos_jobs.node_fault(self.testbed, plan.fault, plan.length)

    def heal(self) -> None:
        self.proxy.resume()
        faults.unshape(200)
        if self.holder is not None:
            self.holder.stop()
            self.holder = None
        if self.orch_full is not None:
            faults.free(self.orch_full.path / ".orch")
            self.orch_full = None
        ct = self.testbed.ct(200)
        if self.full:
            chaos_disk.free(ct)
            self.full = False
        if ct.state() == "FROZEN":
            ct.thaw()
        if not lxc.answers(ct.address, ct.port):
            self.start_sshd()
        chaos_jobs.heal(self.testbed)

    def start_sshd(self) -> None:
        ct = self.testbed.ct(200)
        ct.attach("systemctl", "start", "ssh.service")
        lxc.wait_port(ct.address, ct.port, timeout=20)

    def probe(self, vmid: int = 200) -> dict:
        proc = self.testbed.ct(vmid).attach("python3", "-", ROOT, WORKSPACE, input=PROBE.read_bytes())
        return json.loads(proc.stdout)

    def _remember(self, probe: dict) -> None:
        if probe.get("lock_wait") is not None:
            self.seen.update(checks.checkpoint_folder_files(probe))
