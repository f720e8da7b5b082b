"""A remote run's environment is the target user's login environment, over real sshd in a CT: the same through the
connection keeper's held connection and resident agent (and the standby supervisor) as through a connection of its
own per command (``[ssh] persist = 0``, ``[run] standby = false``); never the controller's shell's, nor what the
agent sets for itself (its locale, for tmux) or tmux's server kept from the first launch; and ``orch exec`` sees
what the runs see."""

from __future__ import annotations

import json

import pytest

from orchestrator.reach.keeper import client
from tests.cli.test_launch_env import ADDED, PROBE, normalised
from tests.conftest import wait_for
from tests.integration.test_keeper_ct import held, warm
from tests.integration.test_remote import ROOT, RemoteProject, on_ct

pytestmark = pytest.mark.testbed

# what legitimately differs between two SSH sessions of one user (the client's port), and the pane's own tmux
SESSION = ("SSH_CLIENT", "SSH_CONNECTION")
PANE = ("TMUX", "TMUX_PANE", "PWD")
# what orch adds: its own variables and the project's [project] env (RemoteProject's)
OURS = ADDED - {"PROJECT_SAYS"} | {"OMP_NUM_THREADS", "TINYLM_STEPS", "TINYLM_SLEEP", "TINYLM_CKPT_EVERY",
                                    "TINYLM_SAMPLES"}
# the second run ends by itself, and the queued third starts then
PROBE_CT = PROBE.replace('float(os.environ.get("PROBE_SLEEP", "60"))',
                         '8 if os.environ["ORCH_EXPERIMENT_ID"] == "2" else 60')
SHOW = "import json, os, sys; print(json.dumps({'env': dict(os.environ), 'exe': sys.executable}))"


def probe_on_ct(testbed, key: str) -> dict:
    path = f"{ROOT}/runs/{key}/train.log"

    def line():
        text = on_ct(testbed, 200, "sh", "-c", f"cat {path} 2>/dev/null || true")
        return next((ln for ln in text.split("\n")[:-1] if ln.startswith("PROBE ")), None)  # whole lines only

    return json.loads(wait_for(line, timeout=60, what=f"the probe line in {path}")[len("PROBE "):])


def launches(testbed, path, fast: bool) -> dict:
    proj = RemoteProject(path, testbed)
    proj.write()
    (path / "train.py").write_text(PROBE_CT)
    env = {"MARKER": "the-controllers-shell", "LC_ALL": "C", "PROBE_SLEEP": "60"} | \
        ({} if fast else {"ORCH_SSH__PERSIST": "0", "ORCH_RUN__STANDBY": "false"})

    def ok(*args: str):
        res = proj.run(*args, "--target", "ct200", env=env)
        assert res.returncode == 0, res.stderr
        return res

    if fast:
        warm(proj, env=env)
    said = []
    for args in (["deploy", "-m", "first"], ["restart", "-m", "second"], ["deploy", "--queue", "-m", "third"]):
        done = ok(*args)
        said.append((args[0], done.stdout, done.stderr))
    runs = [probe_on_ct(testbed, proj.run_key(i)) for i in (1, 2, 3)]
    shown = ok("exec", "--", "python3", "-c", SHOW)
    said.append(("stop", ok("stop").stdout))
    if fast:  # the launches went through the keeper's held connection and its resident agent
        [conn] = held()
        assert conn["agents"] and conn["commands"] >= 6
    else:
        assert client.keepers() == []
    modes = on_ct(testbed, 200, "stat", "-c", "%a", *(f"{ROOT}/runs/{proj.run_key(i)}/launch-env.json"
                                                     for i in (1, 2, 3))).split()
    assert modes == ["600"] * 3
    return {"runs": runs, "said": said, "exec": json.loads(shown.stdout),
            "key": proj.run_key(1).rsplit("-", 1)[0]}


def test_a_remote_run_gets_the_login_environment_through_the_keeper_as_without_it(testbed, tmp_path, monkeypatch,
                                                                                    ct_pair):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", testbed.api.token_secret)
    assert PROBE_CT != PROBE
    results = {}
    for path in ("fast", "plain"):
        folder = tmp_path / path
        folder.mkdir()
        results[path] = launches(testbed, folder, path == "fast")
        client.close(None)
        testbed.ct(200).reset()  # the other path starts from the same pristine CT
    for path, got in results.items():
        login = {k: v for k, v in got["exec"]["env"].items() if k not in SESSION + PANE + ("_",)}
        assert "MARKER" not in login and login.get("LC_ALL") != "C"  # the controller's shell stays on its side
        for run in got["runs"]:
            mine = {k: v for k, v in run["env"].items() if k not in SESSION + PANE + ("_",)}
            # the login environment, with [project] env and orch's own variables: no LC_ALL of the agent's
            assert {k: v for k, v in mine.items() if k not in OURS} == \
                {k: v for k, v in login.items() if k not in OURS}, path
            assert set(mine) - set(login) <= OURS and run["exe"] == got["exec"]["exe"]
            assert run["cwd"] == run["env"]["ORCH_WORK_DIR"]

    def comparable(got: dict) -> list:
        runs = [{**r, "env": {k: v for k, v in r["env"].items() if k not in SESSION + ("TMUX", "TMUX_PANE")}}
                for r in got["runs"]]
        text = json.dumps([runs, got["said"]]).replace(got["key"], "<reg>")
        return json.loads(normalised(text, []))

    assert comparable(results["fast"]) == comparable(results["plain"])
