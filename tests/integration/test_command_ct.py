"""``[project] command`` as users write it, on real containers: a shell line's effects on CT 200, a graceful stop
of a shell-line run, a doomed command refused with the run untouched, ``orch exec`` of a missing program, and a
2-node torchrun job whose string command expands ``$ORCH_NODE_RANK`` on each node."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_command_line import ARGS
from tests.conftest import wait_for
from tests.integration.test_frozen_ct import GRACEFUL
from tests.integration.test_multinode_ct import _log, _on_host, _until, torch_cts  # noqa: F401  (the fixture)
from tests.integration.test_remote import CKPT, on_ct, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

RANKS = ("import os, sys\n"
         "print('args', sys.argv[1:], 'rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n")


def _use(remote, files: dict[str, str], command: str, extra: str = "", entries: bool = True) -> None:  # noqa: F811
    for name, text in files.items():
        (remote.path / name).write_text(text)
    remote.write(sources=json.dumps(sorted(files)), extra=extra, entries=entries)
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('command = "python3 train.py"', f"command = {json.dumps(command)}"))


def _state(remote) -> dict:  # noqa: F811
    res = remote.run("status", "--json", "--no-metrics")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_shell_line_runs_in_a_ct_and_a_shell_line_run_stops_gracefully(remote, testbed):  # noqa: F811
    line = ('mkdir -p $ORCH_CHECKPOINT_DIR/x && python3 job.py --out=${ORCH_CHECKPOINT_DIR}/x "two words" '
            '> $ORCH_RUN_DIR/side.log 2>&1; echo "done $ORCH_EXPERIMENT_ID"')
    _use(remote, {"job.py": ARGS, "graceful.py": GRACEFUL}, line)
    res = remote.run("deploy", "--ct", "200")
    assert res.returncode == 0, res.stderr
    run_dir = f"/workspace/orch/runs/{remote.run_key(1)}"
    ended = _on_host(testbed, 200, f"{run_dir}/exit.json")  # waited for without a process (CLI or in the CT)
    wait_for(ended.exists, timeout=60, what="the shell line's exit code")
    data = wait_for(lambda: (d := _state(remote))["state"] not in ("running", "launching") and d, timeout=60,
                    what="the shell line to end")
    assert (data["state"], data["exit_code"]) == ("finished", 0), data
    ran = json.loads(on_ct(testbed, 200, "cat", f"{CKPT}/x/args.json"))
    assert ran["argv"] == [f"--out={CKPT}/x", "two words"]
    assert on_ct(testbed, 200, "cat", f"{run_dir}/side.log") == "to the side log\n"
    assert "done 1" in on_ct(testbed, 200, "cat", f"{run_dir}/train.log")

    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace(f"command = {json.dumps(line)}",
                                             'command = "python3 graceful.py --tag=$ORCH_EXPERIMENT_ID"'))
    assert remote.run("deploy", "--ct", "200").returncode == 0
    log = f"/workspace/orch/runs/{remote.run_key(2)}/train.log"
    wait_for(lambda: "step=3" in on_ct(testbed, 200, "sh", "-c", f"cat {log} 2>/dev/null || true"),
             what="the run's first steps")

    good = toml.read_text()
    toml.write_text(good.replace('"python3 graceful.py --tag=$ORCH_EXPERIMENT_ID"',
                                 json.dumps("python3 graceful.py --x=" + "x" * 100_000)))
    doomed = remote.run("deploy", "--ct", "200")
    assert doomed.returncode == 2 and "at most 4096" in doomed.stderr and "hint:" in doomed.stderr, doomed.stderr
    toml.write_text(good)
    assert len(remote.rows()) == 2 and _state(remote)["state"] == "running"  # untouched, no new row

    missing = remote.run("exec", "--", "nvidia-smi", "-L")
    assert missing.returncode == 127, missing.stdout + missing.stderr
    assert "error: nvidia-smi: command not found on CT 200" in missing.stderr, missing.stderr
    assert "hint:" in missing.stderr and "sh: " not in missing.stderr
    here = remote.run("exec", "--", "sh", "-c", 'echo "$0 $1" && pwd', "a b", "c")  # the words as given
    assert here.returncode == 0 and here.stdout.splitlines()[0] == "a b c", here.stdout + here.stderr

    stop = remote.run("stop", "--ct", "200")
    assert stop.returncode == 0 and "signals: SIGINT)" in stop.stdout, stop.stdout + stop.stderr
    assert on_ct(testbed, 200, "cat", f"{CKPT}/final.pt") == "done"
    assert remote.registry().get(2).status == "stopped"


def test_a_two_node_job_expands_its_string_command_on_each_node(remote, testbed, torch_cts):  # noqa: F811
    # (not --node=…: torchrun's parser takes it for an abbreviation of its own --node-rank)
    _use(remote, {"ranks.py": RANKS}, 'python3 ranks.py node-$ORCH_NODE_RANK "of $ORCH_NNODES"', entries=False)
    res = remote.run("deploy", "--ct", "200", "--ct", "201")
    assert res.returncode == 0, res.stderr
    data = _until(remote, ("finished", "crashed"), 120)
    assert [(n["state"], n["exit_code"]) for n in data["nodes"]] == [("finished", 0), ("finished", 0)], data
    for rank, node in enumerate(data["nodes"]):
        assert f"args ['node-{rank}', 'of 2'] rank " in _log(testbed, node), _log(testbed, node)
