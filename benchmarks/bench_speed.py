"""Issue 29's speed table in one run: each case against its baseline, pair by pair, on the LXC testbed.

Stands up the test suite's LXC testbed once (root and LXC; the base image is cached; waits for the testbed's
session lock), mounts the torch site folder into CTs 200 and 201 when a case needs torch, then runs the cases
(medians of --runs pairs; in each pair orch and its baseline run one after the other, the order swapped every
pair) and prints one table (case, orch, baseline, ratio, bar, met or not, peak RSS for the push):
  cold     `orch deploy` of a one-line change with no connection keeper and no warm orch process up (each run
           closes them first) vs the hand-typed `scp train.py ct: && ssh ct "tmux kill-session; tmux new -d ..."`;
  coldconn the same deploy after a break: no connection held (the keeper idles out after [ssh] persist, 10
           minutes), the warm orch process up (it idles out after an hour), vs the same hand-typed pair;
  pxbreak  the deploy after a break as users meet it on a Proxmox target: `kind = "proxmox"`, `ct = 200`, the CT
           found through the API stand-in; no connection held, the warm process up, and the CT lookup cache as a
           pause leaves it (remembered longer ago than [proxmox] cache_ttl), vs the same hand-typed pair;
  pxcold   the first deploy of the day on that Proxmox target: no keeper, no warm process (as the cold case), the
           CT's lookup remembered 12 hours ago (within cache_max_age: the API is asked after the answer), vs the
           same hand-typed pair;
  second   the second deploy after a reconnect (the first after `orch connections close` is untimed) vs the
           third, on the same SSH target: whatever starts lazily after a reconnect must not be waited for;
  warm     the same deploy with the keeper, its resident agent and the warm orch process up
           vs the same hand-typed pair with an OpenSSH ControlMaster held;
  wstatus  warm `orch status` of the running deploy (keeper, resident agent, warm process up) vs the hand-typed
           `ssh ct tmux ls` with a ControlMaster held (bar: 100 ms);
  pct      warm deploy on a Proxmox target reached through its node's `pct exec` (access = "pct") vs the same
           warm deploy straight over SSH to the CT (bar: 1.5x);
  push     first deploy of a 1 GiB tree (64 MiB shards of random bytes plus 200 small files; 256 MiB with
           --quick) to an empty root vs `tar c | ssh ct tar x`, with the peak RSS (VmHWM) of orch's processes on
           the controller (the CLI, its keepers and warm processes, and their children) and of the agent in the CT;
  job      `orch deploy --ct 200 --ct 201` (examples/ddp, a 2-node job) vs `orch deploy --ct 200`, both warm
           (revision on every node, keepers up); each run is stopped after it, untimed;
  jobidle  the same with `sleep 100000` as the command, run as it is on each node (launcher "none"): the job case's
           two nodes each start torchrun and its worker (four torch imports on the CTs' shared CPUs) where the one
           node starts train.py alone; here no run takes CPU as the deploy answers, so what is left is orch's own
           work for the second node;
  status   `orch status --all` over 20 SSH targets (5 with --quick; each a real sshd on a loopback port, as
           tests/loopback_sshd.py starts them, with an orch root and a running run of its own) vs the slowest
           single target: the largest of the targets' medians of `orch status --target NAME`, each round asking
           every target alone and then all together (the order swapped every round);
  charlm   deploy -> the first `iter 0:` line of a GPT-style training script in the run's log on CT 200: `orch
           deploy` of a one-line change vs the hand-typed `scp -r` of the same tree and `ssh ct "tmux new -d ..."`
           of the same command, both timed from the controller to the line appearing in the CT's file (read from
           the host through the CT's root folder, every 20 ms).
The charlm case runs benchmarks/charlm/train.py, a small character-level GPT of this project's own written the way
public training scripts are (a config file with --key=value overrides, memory-mapped train.bin/val.bin, a log line
per iteration, checkpoints by rename), with its CPU config. Its data is made on the controller: an input.txt of
1,115,394 characters of Python's standard library sources, turned into train.bin, val.bin and meta.pkl by
benchmarks/charlm/prepare.py. Its .gitignore drops *.bin and *.pkl; the project's .orchignore re-includes them.
torch comes from the testbed's torch site folder (tests/testbed/torchsite.py: installed once by pip, CPU wheel,
into the testbed cache outside the repository), bind-mounted read-only into the CTs.
Never asserts on time. Run as root:
    python benchmarks/bench_speed.py [--runs 5] [--cases cold,coldconn,pxbreak,second,warm,wstatus,pct,...] [--quick]
                                     [--install wheel|checkout]
orch is measured as users install it: a wheel built from the checkout, installed into a venv of its own (its
dependencies this interpreter's); --install checkout measures the checkout's own install instead.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _speed import (Case, PeakWatch, busy_ms, check, cpu_ms, pairs, print_table, quiet, tree, wall,  # noqa: E402
                    wheel_install)
from tests.testbed.procs import pids_running  # noqa: E402

CASES = ("cold", "coldconn", "pxbreak", "pxcold", "second", "warm", "wstatus", "close", "pct", "push", "job", "jobidle",
         "status", "charlm")
TORCH_CASES = {"job", "charlm"}
TRAIN = "import time\n# revision {n}\nwhile True:\n    time.sleep(1)\n"
CHARLM = REPO / "benchmarks" / "charlm"
CHARLM_FILES = ("train.py", "config")
CHARLM_ARGS = "config/cpu.py --device=cpu --max_iters=2000"
INPUT_CHARS = 1_115_394
DDP = REPO / "examples" / "ddp"
DDP_ENV = {"OMP_NUM_THREADS": "1", "DDP_STEPS": "100000", "DDP_SLEEP": "0.2", "DDP_CKPT_EVERY": "100000"}
HAND = "/root/hand"


class Bench:
    """The testbed, the keepers of this benchmark, and the CLI as a user types it."""

    def __init__(self, bed, work: Path, runs: int, quick: bool, bin_dir: Path) -> None:
        self.bed, self.work, self.runs, self.quick = bed, work, runs, quick
        self.script = str(bin_dir / "orch")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # no path to the checkout
        self.env["ORCH_PROXMOX_TOKEN"] = bed.api.token_secret
        self.opts = bed.ssh_options()
        self.dest = f"root@{bed.ct(200).address}"

    def project(self, name: str, sources: list[str], command: str, *, root: str = "/workspace/orch",
                extra: str = "", targets: str | None = None, default: str | None = "ssh200") -> Path:
        proj = self.work / name
        proj.mkdir(exist_ok=True)
        bed = self.bed
        sources_toml = "[" + ", ".join(f'"{s}"' for s in sources) + "]"
        if targets is None:
            targets = f'[targets.ssh200]\nkind = "ssh"\nhost = "{bed.ct(200).address}"\nuser = "root"\n'
        (proj / "orch.toml").write_text(f"""\
{f'default_target = "{default}"' if default else ""}
[project]
name = "{name}"
sources = {sources_toml}
command = "{command}"
{extra}
[paths]
root = "{root}"
checkpoints = "{root}-checkpoints"
{bed.access_toml(self.work / "trusted", command_timeout=120)}{targets}""")
        return proj

    def orch(self, proj: Path, *args: str) -> subprocess.CompletedProcess:
        return check([self.script, *args], cwd=proj, env=self.env, timeout=600)

    def ssh(self, script: str, dest: str | None = None, extra: list[str] = ()) -> None:
        check(["ssh", *self.opts, *extra, dest or self.dest, script], timeout=600)

    @staticmethod
    def close_keepers() -> None:
        """What `orch connections close` and an hour away leave: no keeper, no warm process. Everyone's (this
        benchmark's runtime folder holds its own alone): the installed orch's are not this checkout's own."""
        from orchestrator.reach.keeper import client
        from orchestrator.warm import client as warm_client

        warm_client.close(everyone=True)
        client.close(None, everyone=True)
        deadline = time.monotonic() + 10
        while warm_client.processes() and time.monotonic() < deadline:
            time.sleep(0.01)
        Bench.end_starting()

    @staticmethod
    def end_starting() -> None:
        """A keeper or warm process the last command spawned may still be starting (not yet listening, so no
        close reaches it): the next "cold" command would find it up. End every one by what it runs."""
        from orchestrator.reach.keeper import place
        from orchestrator.warm import client as warm_client

        wanted = (f"-m\0{place.MODULE}\0".encode(), f"-m\0{warm_client.MODULE}\0".encode())
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                line = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if any(w in line for w in wanted):
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except OSError:
                    pass

    def keepers_up(self, proj: Path) -> None:
        from orchestrator.reach.keeper import client
        from orchestrator.warm import client as warm_client

        self.orch(proj, "status")
        deadline = time.monotonic() + 30
        while not (client.keepers() and warm_client.processes()):
            if time.monotonic() > deadline:
                raise SystemExit("no connection keeper or warm orch process came up")
            time.sleep(0.05)
        self.orch(proj, "status")  # its connection and resident agent are up now

    def warm_up(self, proj: Path) -> None:
        """A warm orch process listening (a command that connects to nothing starts one as it ends)."""
        from orchestrator.warm import client as warm_client

        deadline = time.monotonic() + 30
        while not warm_client.processes():
            if time.monotonic() > deadline:
                raise SystemExit("no warm orch process came up")
            self.orch(proj, "experiments", "list")
            time.sleep(0.2)

    def hand_pair(self, proj: Path, i: int, extra: list[str] = ()) -> None:
        """What a user types: copy the edited file, restart it in tmux."""
        (proj / "train.py").write_text(TRAIN.format(n=1000 + i))
        check(["scp", "-q", *self.opts, *extra, str(proj / "train.py"), f"{self.dest}:train.py"])
        self.ssh("tmux kill-session -t train; tmux new -d -s train python3 train.py", extra=extra)

    def hold_tmux(self) -> None:
        """A session that stays, so the hand-typed kill-session never leaves the tmux server empty: a server
        exiting as the next `tmux new` connects fails that command ("server exited unexpectedly")."""
        self.ssh("tmux has-session -t hold 2>/dev/null || tmux new -d -s hold sleep infinity")

    def changed_deploy(self, proj: Path) -> float:
        (proj / "train.py").write_text(TRAIN.format(n=time.time_ns()))
        return wall(lambda i: self.orch(proj, "deploy"))(0)


# cold and warm deploys of a one-line change


def deploy_project(b: Bench) -> Path:
    proj = b.work / "speed"
    if not proj.exists():
        proj = b.project("speed", ["train.py"], "python3 train.py")
        (proj / "train.py").write_text(TRAIN.format(n=0))
        b.orch(proj, "deploy")
    return proj


def case_cold(b: Bench) -> Case:
    proj = deploy_project(b)
    b.hold_tmux()

    def cold(i: int) -> float:
        b.close_keepers()
        return b.changed_deploy(proj)

    mine, hand = pairs(cold, wall(lambda i: b.hand_pair(proj, i)), b.runs)
    b.ssh("tmux kill-server")
    return Case("cold deploy, 1 line changed", mine, hand, "scp + ssh tmux", 1.0)


def case_coldconn(b: Bench) -> Case:
    """The first deploy after a break: the connection keeper has idled out ([ssh] persist, 10 minutes), the warm orch
    process (an hour) has not; the same hand-typed pair as the cold case."""
    from orchestrator.reach.keeper import client

    proj = deploy_project(b)
    b.hold_tmux()

    def after_a_break(i: int) -> float:
        b.warm_up(proj)
        client.close(None, everyone=True)
        return b.changed_deploy(proj)

    mine, hand = pairs(after_a_break, wall(lambda i: b.hand_pair(proj, i)), b.runs)
    b.ssh("tmux kill-server")
    return Case("deploy after a break, 1 line changed", mine, hand, "scp + ssh tmux", 0.8)


def case_warm(b: Bench) -> Case:
    proj = deploy_project(b)
    master = ["-o", "ControlMaster=auto", "-o", f"ControlPath={b.work}/cm-%r@%h:%p", "-o", "ControlPersist=300"]
    b.hold_tmux()
    b.hand_pair(proj, 0, master)  # the master is up
    b.keepers_up(proj)
    mine, hand = pairs(lambda i: b.changed_deploy(proj), wall(lambda i: b.hand_pair(proj, i, master)), b.runs)
    subprocess.run(["ssh", *b.opts, *master, "-O", "exit", b.dest], capture_output=True)
    b.ssh("tmux kill-server")
    b.orch(proj, "stop")
    return Case("warm deploy, 1 line changed", mine, hand, "scp + ssh tmux, ControlMaster", 3.0, ms_bar=120)


def px_project(b: Bench, name: str, access: str) -> Path:
    """A project whose target is CT 200 as a Proxmox user names it: found through the API (stand-in)."""
    proj = b.work / name
    if not proj.exists():
        targets = f'[targets.px200]\nkind = "proxmox"\nct = 200\naccess = "{access}"\nuser = "root"\n'
        proj = b.project(name, ["train.py"], "python3 train.py", targets=targets, default="px200",
                         root=f"/workspace/orch-{name}")
        node = b.bed.node
        config = proj / "orch.toml"
        config.write_text(config.read_text().replace(
            "[ssh]\n", f'node_ssh = {{ user = "root", host = "{node.address}", port = {node.port} }}\n[ssh]\n', 1))
        (proj / "train.py").write_text(TRAIN.format(n=0))
        b.orch(proj, "deploy")
    return proj


def age_lookups(proj: Path, seconds: float) -> None:
    """The project's remembered CT lookups made ``seconds`` older, as a pause leaves them."""
    import json

    cache = proj / ".orch" / "ct-cache.json"
    if cache.exists():
        data = json.loads(cache.read_text())
        for entry in data.values():
            entry["at"] = float(entry.get("at", 0)) - seconds
        cache.write_text(json.dumps(data))


def case_pxbreak(b: Bench) -> Case:
    """The first deploy after a 10-minute pause on a `kind = "proxmox"` target: no connection, warm process up,
    the CT's lookup remembered 10 minutes ago."""
    from orchestrator.reach.keeper import client

    proj = px_project(b, "pxbreak", "ssh")
    b.hold_tmux()

    def after_a_break(i: int) -> float:
        b.warm_up(proj)
        client.close(None, everyone=True)
        age_lookups(proj, 600)
        return b.changed_deploy(proj)

    mine, hand = pairs(after_a_break, wall(lambda i: b.hand_pair(proj, i)), b.runs)
    b.ssh("tmux kill-server")
    b.orch(proj, "stop")
    return Case("deploy after a break, Proxmox target", mine, hand, "scp + ssh tmux", 0.8)


def case_pxcold(b: Bench) -> Case:
    """The first deploy of the day as a Proxmox user meets it: `kind = "proxmox"`, `ct = 200`, over SSH, with no
    keeper and no warm orch process up (``orch connections close``, a reboot of the laptop) and the CT's lookup
    remembered a night ago (past [proxmox] cache_ttl: used while the CT's port answers, the API asked after)."""
    proj = px_project(b, "pxcold", "ssh")
    b.hold_tmux()

    def first_of_the_day(i: int) -> float:
        b.close_keepers()
        age_lookups(proj, 12 * 3600)
        return b.changed_deploy(proj)

    mine, hand = pairs(first_of_the_day, wall(lambda i: b.hand_pair(proj, i)), b.runs)
    b.ssh("tmux kill-server")
    b.orch(proj, "stop")
    return Case("first deploy of the day, Proxmox target", mine, hand, "scp + ssh tmux", 1.0)


def case_second(b: Bench) -> Case:
    """The second deploy after a reconnect against the third: both on a connection the first one opened."""
    from orchestrator.reach.keeper import client

    proj = deploy_project(b)
    seconds: list[float] = []

    def second(i: int) -> float:
        b.warm_up(proj)
        client.close(None, everyone=True)
        b.changed_deploy(proj)  # the reconnect, untimed
        took = b.changed_deploy(proj)
        seconds.append(b.changed_deploy(proj))  # the third, right after, as the baseline
        return took

    mine, _ = pairs(second, lambda i: 0.0, b.runs)
    b.orch(proj, "stop")
    return Case("2nd deploy after a reconnect", mine, statistics.median(seconds), "the 3rd deploy", 1.2)


def case_wstatus(b: Bench) -> Case:
    proj = deploy_project(b)
    master = ["-o", "ControlMaster=auto", "-o", f"ControlPath={b.work}/cm-%r@%h:%p", "-o", "ControlPersist=300"]
    b.hold_tmux()
    b.ssh("true", extra=master)
    b.orch(proj, "deploy")
    b.keepers_up(proj)
    mine, hand = pairs(wall(lambda i: b.orch(proj, "status")), wall(lambda i: b.ssh("tmux ls", extra=master)),
                       b.runs)
    subprocess.run(["ssh", *b.opts, *master, "-O", "exit", b.dest], capture_output=True)
    b.ssh("tmux kill-server")
    b.orch(proj, "stop")
    return Case("warm status", mine, hand, "ssh tmux ls, ControlMaster", None, ms_bar=80)


def case_close(b: Bench) -> Case:
    """``orch connections close`` with a keeper holding a connection and its agent, against closing an OpenSSH
    ControlMaster by hand (``ssh -O exit``): each returns once the connection is gone."""
    proj = deploy_project(b)
    master = ["-o", "ControlMaster=auto", "-o", f"ControlPath={b.work}/cm-%r@%h:%p", "-o", "ControlPersist=300"]

    def close_mine(i: int) -> float:
        b.keepers_up(proj)
        return wall(lambda j: b.orch(proj, "connections", "close"))(0)

    def close_hand(i: int) -> float:
        b.ssh("true", extra=master)
        return wall(lambda j: check(["ssh", *b.opts, *master, "-O", "exit", b.dest]))(0)

    mine, hand = pairs(close_mine, close_hand, b.runs)
    return Case("orch connections close", mine, hand, "ssh -O exit, ControlMaster", None)


def case_pct(b: Bench) -> Case:
    over_pct = px_project(b, "overpct", "pct")
    over_ssh = px_project(b, "overssh", "ssh")
    for proj in (over_pct, over_ssh):
        b.keepers_up(proj)
        b.changed_deploy(proj)
    mine, theirs = pairs(lambda i: b.changed_deploy(over_pct), lambda i: b.changed_deploy(over_ssh), b.runs)
    for proj in (over_pct, over_ssh):
        b.orch(proj, "stop")
    return Case("warm deploy through pct exec", mine, theirs, "the same over SSH", 1.5)


# first push of a big tree


def make_tree(folder: Path, gib: float) -> None:
    data = folder / "data"
    data.mkdir(parents=True)
    for i in range(200):
        (data / f"small{i:03d}.txt").write_bytes(os.urandom(100 + (i * 7919) % 20000))
    shard = 64 << 20
    for i in range(max(1, int(gib * (1 << 30)) // shard)):
        (data / f"shard{i:03d}.bin").write_bytes(os.urandom(shard))
    (folder / "train.py").write_text(TRAIN.format(n=0))


def ct_processes(ct, needle: str) -> set[int]:
    """The processes inside ``ct`` (its PID namespace) whose command line holds ``needle``."""
    ns = os.readlink(f"/proc/{ct.pid()}/ns/pid")

    def inside(pid: int) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/ns/pid") == ns
        except OSError:
            return False
    return {pid for pid in pids_running(needle) if inside(pid)}


def controller_processes(pid: int, runtime: str) -> set[int]:
    """The CLI process ``pid``, the keepers and warm processes of this benchmark (their sockets are under
    ``runtime``), and everything below them."""
    return tree({pid, *pids_running(runtime)})


def case_push(b: Bench) -> Case:
    gib = 0.25 if b.quick else 1.0
    root = "/workspace/orch-push"
    proj = b.project("push", ["train.py", "data"], "python3 train.py", root=root)
    make_tree(proj, gib)
    ct = b.bed.ct(200)
    runtime = os.environ["XDG_RUNTIME_DIR"]
    peaks = [0, 0]

    def tar(i: int) -> float:
        b.ssh("rm -rf /root/tarcopy; sync")
        begin = time.perf_counter()
        pack = subprocess.Popen(["tar", "c", "-C", str(proj), "train.py", "data"], stdout=subprocess.PIPE)
        subprocess.run(["ssh", *b.opts, b.dest, "mkdir -p /root/tarcopy && tar x -C /root/tarcopy"],
                       stdin=pack.stdout, check=True)
        pack.stdout.close()
        pack.wait()
        took = time.perf_counter() - begin
        b.ssh("rm -rf /root/tarcopy; sync")
        return took

    def first_push(i: int) -> float:
        b.ssh(f"rm -rf {root} {root}-checkpoints; sync")
        shutil.rmtree(proj / ".orch", ignore_errors=True)
        b.close_keepers()
        begin = time.perf_counter()
        proc = subprocess.Popen([b.script, "deploy"], cwd=proj, env=b.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        with PeakWatch(lambda: controller_processes(proc.pid, runtime)) as mine, \
                PeakWatch(lambda: ct_processes(ct, ".pyz")) as agent:
            out, err = proc.communicate()
        took = time.perf_counter() - begin
        if proc.returncode != 0:
            raise SystemExit(f"orch deploy (push) failed: {err.decode()}")
        peaks[0], peaks[1] = max(peaks[0], mine.peak), max(peaks[1], agent.peak)
        b.orch(proj, "stop")
        return took

    mine, hand = pairs(first_push, tar, b.runs)
    b.ssh(f"rm -rf {root} {root}-checkpoints")
    shutil.rmtree(proj / "data")
    return Case(f"first push, {gib:g} GiB tree", mine, hand, "tar c | ssh tar x", 1.2,
                rss_mib=(peaks[0] >> 10, peaks[1] >> 10), rss_bar=256)


# a 2-node job against one node


def case_job(b: Bench) -> Case:
    env = ", ".join(f'{k} = "{v}"' for k, v in DDP_ENV.items())
    proj = b.project("ddpspeed", ["train.py", "synthetic.py"], "python3 train.py",
                     extra=f"env = {{ {env} }}\n[batching]\ntoken_budget = 2048\nmax_seq_len = 128\n"
                           "[run]\nstop_timeout = 5\nterm_timeout = 3",
                     targets="", default=None)
    for name in ("train.py", "synthetic.py"):
        shutil.copy(DDP / name, proj / name)
    mine, base, singles = job_pairs(b, proj)
    return Case("2-node job deploy, warm", mine, base, "its slowest node alone, warm", 1.3, notes=(singles,))


def case_jobidle(b: Bench) -> Case:
    """The job case with a command that takes no CPU as it starts, run as it is (no torchrun in front of it on two
    nodes): the CTs' CPUs are orch's alone."""
    proj = b.project("jobidle", ["train.py"], "sleep 100000", targets="", default=None,
                     extra='[run]\nstop_timeout = 5\nterm_timeout = 3\n[distributed]\nlauncher = "none"')
    (proj / "train.py").write_text(TRAIN.format(n=0))
    mine, base, singles = job_pairs(b, proj)
    return Case("2-node job deploy, warm, `sleep` as the command", mine, base, "its slowest node alone, the same",
                1.3, notes=(singles,))


def job_pairs(b: Bench, proj: Path) -> tuple[float, float, str]:
    """The job over CT 200 (SSH) and CT 201 (the node's `pct exec`) against its slowest node alone: each node's own
    warm deploy is timed too, in turn with the job's (the order turned every round), and the slower median is the
    baseline. Also what the table's note says of the two."""
    two, alone = ("--ct", "200", "--ct", "201"), (("--ct", "200"), ("--ct", "201"))
    for cts in (two, *alone):  # warm: the revision is on every node
        b.orch(proj, "deploy", *cts)
        b.orch(proj, "stop")
    b.keepers_up(proj)

    def deploy(cts: tuple[str, ...]) -> float:
        took = wall(lambda i: b.orch(proj, "deploy", *cts))(0)
        b.orch(proj, "stop")
        return took

    times: dict[tuple[str, ...], list[float]] = {cts: [] for cts in (two, *alone)}
    order = [two, *alone]
    for i in range(b.runs):
        for cts in order[i % 3:] + order[:i % 3]:
            quiet()
            times[cts].append(deploy(cts))
    ssh, pct = (statistics.median(times[cts]) for cts in alone)
    note = f"each node alone: CT 200 over SSH {ssh * 1000:.0f} ms, CT 201 through `pct exec` {pct * 1000:.0f} ms"
    return statistics.median(times[two]), max(ssh, pct), note


# status --all over many SSH targets


def case_status(b: Bench) -> Case:
    from tests.loopback_sshd import LoopbackSshd

    count = 5 if b.quick else 20
    fleet = b.work / "fleet"
    fleet.mkdir()
    key = fleet / "id_ed25519"
    check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
    hosts: list[LoopbackSshd] = []
    try:
        targets, known = "", ""
        for n in range(count):
            sshd = LoopbackSshd(fleet / f"sshd{n:02d}").__enter__()
            hosts.append(sshd)
            (sshd.state / "authorized_keys").write_text((fleet / "id_ed25519.pub").read_text())
            known += sshd.host_key_line()
            root = fleet / f"root{n:02d}"
            targets += (f'[targets.h{n:02d}]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {sshd.port}\nuser = "root"\n'
                        f'identity_file = "{key}"\nroot = "{root}"\ncheckpoints = "{root}/checkpoints"\n')
        (fleet / "known_hosts").write_text(known)
        proj = b.project("fleet", ["train.py"], "python3 train.py", targets=targets, default="h00")
        text = (proj / "orch.toml").read_text().replace(b.bed.known_hosts_path, str(fleet / "known_hosts"))
        (proj / "orch.toml").write_text(text)
        (proj / "train.py").write_text(TRAIN.format(n=0))
        names = [f"h{n:02d}" for n in range(count)]
        for name in names:
            b.orch(proj, "deploy", "--target", name)
        shown = b.orch(proj, "status", "--all").stdout
        missing = [t for t in names if t not in shown]
        if missing:
            raise SystemExit(f"status --all did not show {missing}:\n{shown}")
        mine, base = all_and_slowest(b, proj, names)
        split = cpu_split(b, proj, {sshd.proc.pid for sshd in hosts if sshd.proc is not None})
        for name in names:
            b.orch(proj, "stop", "--target", name)
    finally:
        for n, sshd in enumerate(hosts):
            socket = "orch-" + hashlib.sha256(str(fleet / f"root{n:02d}").encode()).hexdigest()[:8]
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
            sshd.__exit__(None, None, None)
    return Case(f"status --all, {count} SSH targets", mine, base, "slowest single target", 1.5, notes=(split,))


def cpu_split(b: Bench, proj: Path, sshds: set[int]) -> str:
    """Where one `status --all` spends CPU here, where the targets' sshd and agents share this machine's cores
    with orch: the targets' side (every process below the fleet's sshds) and the rest (orch's front process, warm
    process, keeper), per command, over --runs commands."""
    runs = max(5, b.runs)
    targets, total = cpu_ms(tree(sshds)), busy_ms()
    for _ in range(runs):
        b.orch(proj, "status", "--all")
    targets, total = (cpu_ms(tree(sshds)) - targets) / runs, (busy_ms() - total) / runs
    return (f"CPU per command: {targets:.0f} ms on the targets' side (sshd, resident agents), {total - targets:.0f} ms "
            f"for the rest (orch and its keeper, on the controller); on {os.cpu_count()} shared CPUs the targets' "
            f"side alone takes {targets / (os.cpu_count() or 1):.0f} ms of wall time that a fleet spends on its own "
            f"machines")


def all_and_slowest(b: Bench, proj: Path, names: list[str]) -> tuple[float, float]:
    """The median of `status --all`, and the largest of the targets' own medians of `status --target NAME`;
    each round asks every target alone and all of them together, the order swapped every round."""
    alone: dict[str, list[float]] = {name: [] for name in names}
    together = []
    every = wall(lambda i: b.orch(proj, "status", "--all"))
    for i in range(b.runs):
        if i % 2:
            together.append(every(i))
        for name in names:
            alone[name].append(wall(lambda j: b.orch(proj, "status", "--target", name))(i))
        if not i % 2:
            together.append(every(i))
    return statistics.median(together), max(statistics.median(times) for times in alone.values())


# deploy -> a GPT-style script's first training step


def charlm_project(b: Bench) -> Path:
    """benchmarks/charlm with its data prepared on this machine: train.bin, val.bin and meta.pkl."""
    text, size = [], 0
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        text.append(path.read_text(errors="replace"))
        size += len(text[-1])
        if size >= INPUT_CHARS:
            break
    proj = b.project("charlm", [*CHARLM_FILES, "data"], f"python3 train.py {CHARLM_ARGS}")
    for name in (*CHARLM_FILES, ".gitignore"):
        (shutil.copytree if (CHARLM / name).is_dir() else shutil.copy)(CHARLM / name, proj / name)
    data = proj / "data" / "chars"
    data.mkdir(parents=True)
    (data / "input.txt").write_text("".join(text)[:INPUT_CHARS])
    check([sys.executable, str(CHARLM / "prepare.py"), str(data)])
    (proj / ".orchignore").write_text("!*.bin\n!*.pkl\n")
    return proj


def first_line(files, begin: float, timeout: float = 300) -> float:
    """Seconds from ``begin`` (``time.time()``) until one of ``files()`` holds an `iter 0:` line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in files():
            try:
                if b"\niter 0:" in b"\n" + path.read_bytes():
                    return time.time() - begin
            except OSError:
                continue
        time.sleep(0.02)
    raise SystemExit(f"no `iter 0:` line within {timeout:g} s")


def case_charlm(b: Bench) -> Case:
    proj = charlm_project(b)
    ct = b.bed.ct(200)
    config = proj / "config" / "cpu.py"
    original = config.read_text()
    b.orch(proj, "deploy")  # the torch-free part of a first deploy is not what this case measures
    b.orch(proj, "stop")
    b.ssh("python3 -c 'import numpy, torch'")  # torch's files in the page cache before either side's first run
    b.ssh("rm -rf /root/charlm && mkdir -p /root/charlm")
    b.hold_tmux()
    runs_dir = ct.delta / "workspace" / "orch" / "runs"
    hand_log = ct.delta / "root" / "charlm" / "train.log"

    def orch_once(i: int) -> float:
        config.write_text(original + f"# run {time.time_ns()}\n")
        earlier = set(runs_dir.glob("*/train.log"))  # the new run's log is the one that was not there
        begin = time.time()
        proc = subprocess.Popen([b.script, "deploy"], cwd=proj, env=b.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        took = first_line(lambda: set(runs_dir.glob("*/train.log")) - earlier, begin)
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"orch deploy (charlm) failed: {err.decode()}")
        b.orch(proj, "stop")
        return took

    def hand_once(i: int) -> float:
        config.write_text(original + f"# run {time.time_ns()}\n")
        b.ssh("rm -f /root/charlm/train.log")
        begin = time.time()
        check(["scp", "-rq", *b.opts, *(str(proj / n) for n in (*CHARLM_FILES, "data")), f"{b.dest}:charlm/"])
        b.ssh(f"tmux kill-session -t nano 2>/dev/null; tmux new -d -s nano -c /root/charlm "
              f"'PYTHONUNBUFFERED=1 python3 train.py {CHARLM_ARGS} > train.log 2>&1'")
        took = first_line(lambda: [hand_log], begin)
        b.ssh("tmux kill-session -t nano; while pgrep -f '[t]rain.py config' >/dev/null; do sleep 0.05; done")
        return took

    mine, hand = pairs(orch_once, hand_once, b.runs)
    b.ssh("tmux kill-server")
    config.write_text(original)
    return Case("deploy -> GPT-style script iter 0 (CPU config)", mine, hand, "scp -r + ssh tmux", 1.1)


RUNNERS = {"cold": case_cold, "coldconn": case_coldconn, "pxbreak": case_pxbreak, "pxcold": case_pxcold,
           "second": case_second,
           "close": case_close, "wstatus": case_wstatus, "pct": case_pct, "warm": case_warm, "push": case_push,
           "job": case_job, "jobidle": case_jobidle, "status": case_status, "charlm": case_charlm}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ap.add_argument("--quick", action="store_true", help="small sizes: a 256 MiB push, 5 SSH targets")
    ap.add_argument("--install", choices=("wheel", "checkout"), default="wheel",
                    help="orch as users install it (a wheel in a venv of its own: the default), or this checkout's")
    ap.add_argument("--source", type=Path, default=REPO,
                    help="the checkout the wheel is built from (another revision's, for a before and after)")
    a = ap.parse_args()
    chosen = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    from tests.integration.conftest import Testbed
    from tests.testbed import lxc, torchsite

    work = Path(tempfile.mkdtemp(prefix="orch-bench-speed-"))
    if a.install == "wheel":  # an editable install's path or import hook costs every Python start what users never pay
        bin_dir = wheel_install(work, sys.executable, a.source)
    else:
        import compileall

        # orch's bytecode, as a wheel install has it: with PYTHONDONTWRITEBYTECODE set, every `orch` of a checkout
        # would otherwise compile the modules it loads before it hands the command on
        compileall.compile_dir(REPO / "orchestrator", quiet=2)
        bin_dir = Path(sys.executable).parent
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="orch-rt-")  # keepers of this benchmark only
    (work / "bed").mkdir()
    cases: list[Case] = []
    failed: list[str] = []
    mounted = False
    with lxc.session_lock():
        bed = Testbed(work / "bed")
        try:
            bed.setup()
            for vmid in (200, 201):
                bed.reset(vmid)
            if TORCH_CASES & set(chosen):
                site = torchsite.ensure_site()
                for vmid in (200, 201):
                    torchsite.mount(bed.ct(vmid), site)
                mounted = True
            b = Bench(bed, work, a.runs, a.quick, bin_dir)
            for name in chosen:
                begin = time.monotonic()
                try:
                    cases.append(RUNNERS[name](b))
                except SystemExit as exc:  # a step that failed: the other cases still run
                    failed.append(f"{name}: {exc}")
                print(f"{name}: done in {time.monotonic() - begin:.0f} s; load average "
                      f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
        finally:
            for _ in range(20):  # a warm process the last command started may still be coming up: closed too
                Bench.close_keepers()
                time.sleep(0.1)
            if mounted:
                for vmid in (200, 201):
                    torchsite.unmount(bed.ct(vmid))
            bed.teardown()
            shutil.rmtree(work, ignore_errors=True)
    print_table(cases, f"orch from {f'a wheel of {a.source} in a venv' if a.install == 'wheel' else 'the checkout'}; "
                       f"testbed CTs over the bridge, loopback sshd for the fleet; medians of {a.runs} pairs; "
                       f"{os.cpu_count()} CPUs; load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
                       + ("; --quick sizes" if a.quick else ""))
    for line in failed:
        print(f"not measured: {line}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
