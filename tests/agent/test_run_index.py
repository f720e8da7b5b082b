"""A target keeps every run folder: the agent's lookups over them (live runs, a project's newest runs, the runs a
stop acts on) give what reading every folder's state gives, on a random mix of live, ended, lost and
never-started runs of several projects and clones, and a start reads no run folder where no reboot unit exists."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent import procstat
from orchestrator.agent.run import reboot_unit, runs
from orchestrator.agent.layout import Layout

PROJECTS = ("alpha", "beta", "gamma")
REGISTRIES = ("aaaaaaaaaaaa", "bbbbbbbbbbbb", None)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _fill(layout: Layout, rng: random.Random, count: int, live_pid: int) -> None:
    """``count`` run folders as months of deploys leave them, their start times shuffled."""
    os.makedirs(layout.runs, exist_ok=True)
    dead = {"supervisor": 999_999_9, "supervisor_start": 1, "child": 999_999_8, "child_start": 1, "started": 1.0}
    alive = {"supervisor": live_pid, "supervisor_start": procstat.start(live_pid), "child": live_pid,
             "child_start": procstat.start(live_pid), "started": 1.0}
    for n in range(1, count + 1):
        registry = rng.choice(REGISTRIES)
        d = Path(layout.runs) / (f"{registry}-{n}" if registry else str(n))
        d.mkdir()
        kind = rng.choice(("finished", "finished", "crashed", "running", "lost", "not started", "no record",
                           "launching"))
        if kind != "no record":
            (d / "experiment.json").write_text(json.dumps({"id": n, "project": rng.choice(PROJECTS)}))
            born = 1_700_000_000 + rng.randrange(0, 10_000_000)
            os.utime(d / "experiment.json", (born, born))
        if kind in ("finished", "crashed"):
            (d / "pid.json").write_text(json.dumps(dead))
            (d / "exit.json").write_text(json.dumps({"exit_code": 0 if kind == "finished" else 1, "ended": 2.0}))
        elif kind == "running":
            (d / "pid.json").write_text(json.dumps(alive))
        elif kind == "lost":
            (d / "pid.json").write_text(json.dumps(dead))
        elif kind == "not started":
            (d / "exit.json").write_text(json.dumps({"exit_code": None, "not_started": True, "ended": 2.0}))
        elif kind == "launching":
            (d / "launch.json").write_text(json.dumps({"created": 4e9}))  # young for a long while
    (Path(layout.runs) / "not-a-run").mkdir()


def _every(layout: Layout, project: str | None) -> list[tuple[float, int, str]]:
    """Every run folder of ``project``, oldest first, each one's record read: the plain definition."""
    found = []
    for name in os.listdir(layout.runs):
        key = runs.parse_run_key(name)
        if key is None:
            continue
        d = os.path.join(layout.runs, name)
        exp = runs.read_json(os.path.join(d, "experiment.json"), {}) or {}
        if project is not None and exp.get("project") != project:
            continue
        try:
            born = os.stat(os.path.join(d, "experiment.json")).st_mtime
        except OSError:
            born = 0.0
        found.append((born, key[1], d))
    return sorted(found)


@pytest.mark.parametrize("seed", range(4))
def test_lookups_match_reading_every_folder(tmp_path: Path, sleeper: int, seed: int):
    rng = random.Random(seed)
    layout = Layout(str(tmp_path / "root"))
    _fill(layout, rng, 300, sleeper)
    states = {d: runs.run_state(d) for *_, d in _every(layout, None)}
    kinds = {s["state"] for s in states.values()}
    assert {"running", "launching", "lost", "finished", "crashed", "failed"} <= kinds  # the mix is there
    for project in (*PROJECTS, None):
        plain = _every(layout, project)
        live = [states[d] for *_, d in plain if states[d]["state"] in ("running", "launching")]
        assert runs.alive_runs(layout, project) == live
        for last in (1, 20, 1000):
            newest = [states[d]["id"] for *_, d in plain[-last:]]
            shown = runs.status(layout, project, last=last, tail=False)["runs"]
            assert [r["id"] for r in shown] == newest
            assert [{k: v for k, v in r.items() if k != "log_mtime"} for r in shown] == \
                [{k: v for k, v in states[d].items() if k != "log_mtime"} for *_, d in plain[-last:]]
        for registry in REGISTRIES[:2]:
            ids = sorted(rng.sample(range(1, 301), 40))
            mine = [d for *_, d in plain if runs.parse_run_key(os.path.basename(d))[1] in ids
                    and runs.parse_run_key(os.path.basename(d))[0] in (None, registry)]
            assert [d for *_, d in runs._runs(layout, project, ids, registry)] == mine
            assert [d for *_, d in runs._runs(layout, project, ids, registry, live=True)] == \
                [d for d in mine if not os.path.exists(os.path.join(d, "exit.json"))]


def test_reboot_units_are_found_by_one_listing(tmp_path: Path):
    units = tmp_path / "units"
    units.mkdir()
    assert reboot_unit.installed_names(str(units)) == set()
    assert reboot_unit.installed_names(str(tmp_path / "absent")) == set()
    run_dir = str(tmp_path / "root" / "runs" / "aaaaaaaaaaaa-3")
    os.makedirs(tmp_path / "running")
    assert reboot_unit.install(run_dir, "/usr/bin/python3", "/root/agent.pyz", units=str(units),
                               running=str(tmp_path / "running")) == ""
    (units / "ssh.service").write_text("[Unit]\n")
    assert reboot_unit.installed_names(str(units)) == {reboot_unit.unit_name(run_dir)}
    reboot_unit.remove(run_dir, str(units))
    assert reboot_unit.installed_names(str(units)) == set()
