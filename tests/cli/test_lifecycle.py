"""The core lifecycle on the local target, through the real CLI, real tmux and a real registry."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import snapshot
from tests.waits import wait_for


def wait_status(project, exp_id: int, states: tuple[str, ...], timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        res = project.cli("status", "--json")
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        if data["experiment"] == exp_id and data["state"] in states:
            return data
        assert time.monotonic() < deadline, f"experiment {exp_id} never reached {states}: {data}"
        time.sleep(0.3)


def test_deploy_runs_to_finished_and_records_everything(project):
    project.configure(steps=30, ckpt_every=10)
    res = project.cli("deploy", "-m", "baseline", "--json")
    assert res.exit_code == 0, res.output
    exp = json.loads(res.stdout)["experiment"]
    assert exp["id"] == 1 and exp["status"] in ("running", "finished")
    final = wait_status(project, 1, ("finished",))
    assert final["exit_code"] == 0
    show = json.loads(project.cli("experiments", "show", "1", "--json").stdout)
    for key in ("id", "status", "exit_code", "target", "revision", "command", "batching", "parent",
                "checkpoints_action", "message"):
        assert key in show
    assert show["status"] == "finished" and show["exit_code"] == 0 and show["message"] == "baseline"
    assert show["command"] == "python3 train.py" and show["target"] == "local"  # as written: a shell line
    assert show["batching"]["strategy"] == "megabatch" and show["batching"]["token_budget"] == 4096
    assert show["checkpoints_action"] == "kept" and show["parent"] is None
    # the target describes itself without the controller's database
    run_dir = project.run_dir(1)
    on_target = json.loads((run_dir / "experiment.json").read_text())
    assert on_target["id"] == 1 and on_target["revision"] == show["revision"]
    batching = json.loads((run_dir / "batching.json").read_text())
    assert batching["strategy"] == "megabatch"
    log = (run_dir / "train.log").read_text()
    assert "step=30" in log or "done step=30" in log
    revision_dir = project.root / "revisions" / show["revision"]
    assert (revision_dir / "train.py").read_bytes() == (project.path / "train.py").read_bytes()
    assert sorted(p.name for p in project.checkpoints.iterdir())  # the run wrote checkpoints


def test_run_environment_is_handed_to_the_command(project):
    (project.path / "env.py").write_text(
        "import json, os\nkeys = ['ORCH_EXPERIMENT_ID', 'ORCH_RUN_DIR', 'ORCH_CHECKPOINT_DIR', 'ORCH_BATCHING_FILE']\n"
        "print(json.dumps({k: os.environ.get(k) for k in keys}))\n"
        "print(json.dumps(json.load(open(os.environ['ORCH_BATCHING_FILE']))))\n")
    project.configure()
    res = project.cli("deploy", "--set", "project.sources=['env.py']", "--set", "project.command=python3 env.py",
                      "--set", "batching.seed=7")
    assert res.exit_code == 0, res.output
    wait_status(project, 1, ("finished",))
    lines = (project.run_dir(1) / "train.log").read_text().splitlines()
    env, batching = json.loads(lines[0]), json.loads(lines[1])
    assert env["ORCH_EXPERIMENT_ID"] == "1"
    assert env["ORCH_RUN_DIR"] == str(project.run_dir(1))
    assert env["ORCH_CHECKPOINT_DIR"] == str(project.checkpoints)
    assert batching["seed"] == 7 and batching["strategy"] == "megabatch"


def test_crash_is_recorded_with_its_exit_code(project):
    project.configure(steps=200, extra="")
    res = project.cli("deploy", "--set", "project.env.TINYLM_CRASH_AT_STEP=5", "--json")
    assert res.exit_code in (0, 1), res.output
    # a crash inside verify's window is reported at once (exit 1); later, status discovers it
    data = wait_status(project, 1, ("crashed",))
    assert data["exit_code"] == 3
    show = json.loads(project.cli("experiments", "show", "1", "--json").stdout)
    assert show["status"] == "crashed" and show["exit_code"] == 3
    assert res.exit_code in (0, 1)
    status_text = project.cli("status")
    assert "crashed" in status_text.stdout and "exit code 3" in status_text.stdout


def test_restart_moves_checkpoints_and_restore_brings_them_back(project):
    project.configure(steps=100000, ckpt_every=5, sleep=0.01)
    assert project.cli("deploy", "-m", "first").exit_code == 0
    deadline = time.monotonic() + 30
    while len(list(project.checkpoints.glob("ckpt-*.npz"))) < 2:
        assert time.monotonic() < deadline, "no checkpoints written"
        time.sleep(0.2)
    # without --yes and without a terminal: refused, nothing touched, nothing recorded
    refused = project.cli("restart", "--clean-checkpoints")
    assert refused.exit_code == 2 and "--yes" in refused.output
    assert [e.id for e in project.registry().list()] == [1]
    res = project.cli("restart", "--clean-checkpoints", "--yes", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    exp = out["experiment"]
    assert exp["id"] == 2 and exp["parent"] == 1 and exp["checkpoints_action"] == "moved"
    assert out["stopped"][0]["id"] == 1 and out["stopped"][0]["state"] == "stopped"
    entry_path = exp["checkpoints_entry"]
    moved = snapshot(project.root / "checkpoints.trash")
    assert moved and all(".trash/" in k for k in moved)
    first = project.registry().get(1)
    assert first.status == "stopped" and first.exit_code is not None
    assert project.cli("stop").exit_code == 0
    # the new run wrote fresh checkpoints; move them aside, then restore the old ones byte for byte
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0
    entry = entry_path.rsplit("/", 1)[1]
    originals = {k.split(entry + "/", 1)[1]: v for k, v in moved.items() if entry in k and
                 not k.endswith(".orch-trash.json")}
    res = project.cli("checkpoints", "restore", entry)
    assert res.exit_code == 0, res.output
    restored = {str(p.relative_to(project.checkpoints)): p.read_bytes()
                for p in project.checkpoints.rglob("*") if p.is_file()}
    assert restored == originals
    listing = json.loads(project.cli("checkpoints", "list", "--json").stdout)
    assert entry not in [e["name"] for e in listing["entries"]]


def test_purge_deletes_only_the_named_trash_entry(project):
    project.checkpoints.mkdir(parents=True)
    (project.checkpoints / "a.pt").write_bytes(b"x" * 1000)
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0
    (project.checkpoints / "b.pt").write_bytes(b"y" * 10)
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0
    entries = json.loads(project.cli("checkpoints", "list", "--json").stdout)["entries"]
    assert len(entries) == 2
    refused = project.cli("checkpoints", "purge", entries[0]["name"])
    assert refused.exit_code == 2
    assert project.cli("checkpoints", "purge", entries[0]["name"], "--yes").exit_code == 0
    left = json.loads(project.cli("checkpoints", "list", "--json").stdout)["entries"]
    assert [e["name"] for e in left] == [entries[1]["name"]]
    bad = project.cli("checkpoints", "purge", "../../etc", "--yes")
    assert bad.exit_code != 0 and "not a trash entry" in bad.output


def test_stop_is_graceful_and_recorded(project):
    project.configure(steps=100000, sleep=0.01)
    # the SIGINT's grace is long enough for tinylm's save (an fsync) on a busy disk: a stop returns when the
    # run exits, so only a run that ignored the SIGINT would make it wait the whole grace
    config = project.path / "orch.toml"
    config.write_text(config.read_text().replace("stop_timeout = 5", "stop_timeout = 120"))
    assert project.cli("deploy").exit_code == 0
    # from its first step on, tinylm has its handler: the SIGINT is the one it saves on, not Python's default
    wait_for(lambda: "step=10 " in project.run_dir(1).joinpath("train.log").read_text(), timeout=90,
             what="the run's first logged step")
    res = project.cli("stop", "--json")
    assert res.exit_code == 0, res.output
    stopped = json.loads(res.stdout)["stopped"]
    assert stopped[0]["signals"] == ["SIGINT"]  # tinylm saves and exits on SIGINT: no escalation
    log = project.run_dir(1).joinpath("train.log").read_text()
    assert "stopped by signal 2 at step=" in log, log[-2000:]
    exp = project.registry().get(1)
    assert exp.status == "stopped" and exp.ended is not None
    assert project.cli("stop").stdout.strip() == "nothing was running on local"


def test_the_cli_as_a_subprocess(project):
    project.configure(steps=20)
    res = project.run("deploy", "-m", "from a shell")
    assert res.returncode == 0, res.stderr
    assert "experiment 1" in res.stdout
    deadline = time.monotonic() + 60
    while True:
        st = json.loads(project.run("status", "--json").stdout)
        if st["state"] == "finished":
            break
        assert time.monotonic() < deadline
        time.sleep(0.3)
    listed = json.loads(project.run("experiments", "list", "--json").stdout)
    assert [e["id"] for e in listed] == [1] and listed[0]["message"] == "from a shell"
    logs = project.run("logs", "-n", "3")
    assert logs.returncode == 0 and len(logs.stdout.strip().splitlines()) == 3


def test_declared_lengths_are_planned_and_recorded(project):
    import numpy as np

    lengths = np.random.default_rng(3).lognormal(4.5, 0.8, 3000).astype(np.int64) + 1
    np.save(project.path / "lengths.npy", np.minimum(lengths, 512))
    project.configure(steps=10)
    res = project.cli("deploy", "--set", "batching.lengths=lengths.npy", "--set", "batching.strategy=bucketed",
                      "--json")
    assert res.exit_code == 0, res.output
    show = json.loads(project.cli("experiments", "show", "1", "--json").stdout)
    buckets = show["batching"]["buckets"]
    assert buckets[0] == 0 and buckets[-1] == 512 and len(buckets) == 7  # optimized for num_buckets = 6
    plan = show["batching_plan"]
    assert 0 < plan["efficiency"] <= 1 and 0 < plan["efficiency_vs_sorted"] <= 1.0 + 1e-9
    text = project.cli("experiments", "show", "1").stdout
    assert "planned (from the sample lengths)" in text and "efficiency" in text
    # the run receives the resolved table, optimized boundaries included
    handed = json.loads((project.run_dir(1) / "batching.json").read_text())
    assert handed["buckets"] == buckets
    bad = project.cli("deploy", "--set", "batching.lengths=nope.npy")
    assert bad.exit_code == 2 and "nope.npy" in bad.output


def test_a_target_shared_with_another_clone_keeps_its_own_numbering(project, tmp_path):
    import shutil

    from tests.conftest import Project

    project.configure(steps=5)
    assert project.cli("deploy").exit_code == 0
    other_path = tmp_path / "clone"
    shutil.copytree(project.path, other_path, ignore=shutil.ignore_patterns(".orch"))
    other = Project(other_path, project.root)
    res = other.cli("deploy", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["experiment"]["id"] == 1  # each registry numbers its own runs
    assert project.run_dir(1) != other.run_dir(1) and other.run_dir(1).is_dir() and project.run_dir(1).is_dir()


def test_git_commit_and_dirty_diff_are_recorded(project):
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(project.path), *args], check=True, capture_output=True)

    project.configure(steps=5)
    git("init", "-q")
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "add", "train.py")
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "start")
    assert project.cli("deploy").exit_code == 0
    clean = project.registry().get(1)
    assert clean.git_commit and len(clean.git_commit) == 40 and clean.git_dirty is False
    with (project.path / "train.py").open("a") as fh:
        fh.write("# tuned\n")
    assert project.cli("deploy").exit_code == 0
    dirty = project.registry().get(2)
    assert dirty.git_dirty is True and "+# tuned" in (dirty.git_diff or "")
    assert dirty.revision != clean.revision
    assert "(dirty)" in project.cli("experiments", "show", "2").stdout


def test_status_all_reports_every_target_and_survives_an_unreachable_one(project):
    project.configure(steps=5, extra='\n[targets.gone]\nkind = "ssh"\nhost = "127.0.0.1"\nport = 1\n'
                                     '\n[ssh]\nconnect_timeout = 2\nconnect_retries = 0\n')
    assert project.cli("deploy").exit_code == 0
    reg = project.registry()
    reg.create(project="tinylm", target="gone", revision="r", command=["x"], status="running")
    res = project.cli("status", "--all", "--json")
    assert res.exit_code == 0, res.output
    rows = {r["target"]: r for r in json.loads(res.stdout)}
    assert rows["local"]["experiment"] == 1 and rows["local"]["state"] in ("running", "finished")
    assert "error" in rows["gone"] and rows["gone"]["state"] == "running"
    text = project.cli("status", "--all").stdout
    assert "gone: unreachable" in text and "local: experiment 1" in text


def test_retention_deletes_only_what_the_confirmation_named(project):
    project.configure(extra="\n[trash]\nkeep = 1\n")
    project.checkpoints.mkdir(parents=True)
    (project.checkpoints / "a.pt").write_bytes(b"a")
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0
    first = json.loads(project.cli("checkpoints", "list", "--json").stdout)["entries"][0]["name"]
    (project.checkpoints / "b.pt").write_bytes(b"b")
    refused = project.cli("checkpoints", "clean")  # no terminal, no --yes: nothing moved, nothing deleted
    assert refused.exit_code == 2 and f"PERMANENTLY DELETE {first}" in refused.output
    assert [e["name"] for e in json.loads(project.cli("checkpoints", "list", "--json").stdout)["entries"]] == [first]
    res = project.cli("deploy", "--clean-checkpoints", "--yes", "--json")
    assert res.exit_code == 0, res.output
    assert f"will PERMANENTLY DELETE 1 older trash entry: {first}" in res.stderr
    assert [p["entry"] for p in json.loads(res.stdout)["checkpoints"]["purged"]] == [first]


def test_purge_deletes_only_the_confirmed_files_not_the_stopping_runs_last_checkpoint(project):
    project.configure(steps=100000, ckpt_every=10**6, sleep=0.01)
    assert project.cli("deploy").exit_code == 0
    project.checkpoints.mkdir(parents=True, exist_ok=True)
    (project.checkpoints / "pretrained.pt").write_bytes(b"confirmed for deletion")
    res = project.cli("restart", "--purge", "--yes", "--json")
    assert res.exit_code == 0, res.output
    ck = json.loads(res.stdout)["checkpoints"]
    assert ck["action"] == "purged" and ck["deleted"] == 1
    assert len(ck["kept"]) == 1 and ck["kept"][0].startswith("ckpt-")  # written on SIGINT, after the question
    assert (Path(ck["entry_path"]) / ck["kept"][0]).is_file()
    assert not list(Path(ck["entry_path"]).rglob("pretrained.pt"))
    assert project.cli("stop").exit_code == 0
