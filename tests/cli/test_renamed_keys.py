"""Settings renamed to one name each: an orch.toml with the old names keeps working, with one warning line."""

from __future__ import annotations

import json
import time


def _with_run_keys(project, text: str, extra: str = "") -> None:
    project.configure(extra=extra)
    toml = project.path / "orch.toml"
    toml.write_text(toml.read_text().replace("[run]\n", f"[run]\n{text}", 1))


SILENT = "import time\nprint('loading', flush=True)\ntime.sleep(600)\n"


def test_an_old_key_still_works_with_one_warning_naming_the_new_one(project):
    _with_run_keys(project, "stall_timeout = 1.5\n", extra="\n[distributed]\nmax_restarts = 0\n")
    (project.path / "silent.py").write_text(SILENT)
    res = project.run("deploy", "--set", "project.sources=['silent.py']", "--set", "project.command=python3 silent.py",
                      "--json")
    assert res.returncode == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 2, res.stderr
    assert any("[run] stall_timeout is now [run] stall_after (read as stall_after = 1.5)" in w for w in warnings)
    assert any("[distributed] max_restarts is now [run] restarts (read as restarts = 0)" in w for w in warnings)
    exp_id = json.loads(res.stdout)["experiment"]["id"]  # stdout stays JSON
    log = project.run_dir(exp_id) / "train.log"
    deadline = time.monotonic() + 60
    while "stopped as stalled" not in (log.read_text() if log.exists() else ""):  # the old key drives the supervisor
        assert time.monotonic() < deadline, "the silent run was never stopped as stalled"
        time.sleep(0.2)


def test_old_and_new_keys_that_disagree_stop_before_anything_happens(project):
    _with_run_keys(project, "restarts = 3\n", extra="\n[distributed]\nmax_restarts = 1\n")
    res = project.run("deploy")
    assert res.returncode == 2, res.stderr
    assert "error: " in res.stderr and "[distributed] max_restarts = 1 and [run] restarts = 3 disagree" in res.stderr
    assert "hint: keep only [run] restarts" in res.stderr
    assert not (project.root / "runs").exists() and not (project.path / ".orch" / "experiments.db").exists()
