"""Into the run on real containers, over SSH (CT 200) and through the node's pct (CT 201).

`attach` on a pseudo-terminal shows the run's pane and C-b d leaves the run running; `exec` passes the
command's output and exit code through and runs in the run's work folder; `ssh` gives a shell there; `forward`
reaches a port a run serves.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.cli.test_into import DETACH, cli_argv, drive_pty
from tests.integration.test_remote import ROOT, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

SERVER = """\
import http.server
print("serving on 8765", flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", 8765), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def _deploy(remote, name: str) -> dict:
    res = remote.cli("deploy", "--target", name, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["experiment"]


@pytest.mark.parametrize("name", ["ct200", "ct201"])
def test_attach_exec_and_ssh(remote, name):
    exp = _deploy(remote, name)
    code, screen = drive_pty(cli_argv("attach"), remote.path, [("python3 train.py", DETACH)])
    assert code == 0, screen
    assert f"orch: experiment run in {ROOT}/runs/{remote.run_key(1)}" in screen and "detached" in screen
    status = remote.cli("status", "--json")
    assert json.loads(status.stdout)["state"] == "running", status.output
    res = remote.run("exec", "--", "sh", "-c", 'pwd; echo "$ORCH_EXPERIMENT_ID $ORCH_RUN_DIR"; echo to-stderr >&2; '
                     'exit 7')
    assert res.returncode == 7, res.stderr
    run_dir = f"{ROOT}/runs/{remote.run_key(exp['id'])}"
    assert res.stdout.split("\n")[:2] == [f"{run_dir}/work", f"{exp['id']} {run_dir}"]  # the run's variables too
    assert res.stderr.strip() == "to-stderr"
    piped = subprocess.run(cli_argv("exec", "--", "cat"), cwd=remote.path, input="piped\n", capture_output=True,
                           text=True, timeout=60)
    assert piped.returncode == 0 and piped.stdout == "piped\n", piped.stderr
    code, screen = drive_pty(cli_argv("ssh"), remote.path,
                             [("# ", b"echo marker-$((6*7)) at-$(pwd)-$ORCH_EXPERIMENT_ID-end\r"),
                              ("marker-42", b"exit\r")])
    assert code == 0, screen
    assert f"marker-42 at-{run_dir}/work-{exp['id']}-end" in screen  # the shell starts there, with the run's variables


def test_attach_refuses_without_a_terminal(remote):
    res = subprocess.run(cli_argv("attach", "--target", "ct200"), cwd=remote.path, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "needs a terminal" in res.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", ["ct200", "ct201"])
def test_forward_reaches_a_port_the_run_serves(remote, name):
    (remote.path / "train.py").write_text(SERVER)
    _deploy(remote, name)
    local = _free_port()
    proc = subprocess.Popen(cli_argv("forward", f"8765:{local}"), cwd=remote.path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert f"forwarding http://127.0.0.1:{local}/" in line, line
        deadline, body = time.monotonic() + 20, ""
        while "train.py" not in body:  # the server may take a moment to listen
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5).read().decode()
            except OSError:
                assert time.monotonic() < deadline, "the forwarded port never answered"
                time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "stopped forwarding" in err
