"""``[notify]``: webhook notifications sent by the run's supervisor on the local target, received by a real
HTTP server on loopback while no orch command runs, in each format's documented shape; a dead webhook that
leaves the run alone and shows in ``orch status``; ``orch notify test``; the URL recorded nowhere."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cli.test_lifecycle import wait_status
from tests.webhook import Webhook, closed_port_url

JOB = """\
import os, sys, time
mode = os.environ["JOB_MODE"]
attempt = int(os.environ.get("ORCH_ATTEMPT", "0"))
for i in range(3):
    print(f"step={i} loss={1.0 / (i + 1):.3f}", flush=True)
if mode == "crash" or (mode == "flaky" and attempt == 0):
    time.sleep(2)  # past the launch's start check: orch has exited when the crash comes
    print("Traceback (most recent call last):\\nRuntimeError: CUDA error: out of memory", flush=True)
    sys.exit(3)
if mode == "stall":
    time.sleep(600)
if mode == "rates":  # experiment 1 at 10,000 tok/s; a later one at 3,000 with a loss spike at step 30
    rate = 10000 if os.environ["ORCH_EXPERIMENT_ID"] == "1" else 3000
    for step in range(3, 40):
        loss = 9.0 if step == 30 and rate < 10000 else 2.0 + 0.01 * (step % 3)
        print(f"step={step} loss={loss:.2f} tok/s={rate}", flush=True)
        time.sleep(0.02)
"""


def configure(project, mode: str, notify: str, run: str = "") -> None:
    (project.path / "job.py").write_text(JOB)
    project.configure()
    path = project.path / "orch.toml"
    text = path.read_text()
    lines = [line for line in text.splitlines() if not line.startswith(("sources =", "command =", "env ="))]
    at = lines.index('name = "tinylm"') + 1
    lines[at:at] = ['sources = ["job.py"]', 'command = "python3 job.py"', f'env = {{ JOB_MODE = "{mode}" }}']
    at = lines.index("[run]") + 1
    lines[at:at] = [line for line in run.splitlines() if line]
    path.write_text("\n".join(lines) + "\n\n[notify]\n" + notify + "\n")


def deploy(project) -> None:
    res = project.run("deploy", "-m", "notify")
    assert res.returncode == 0, res.stdout + res.stderr


def run_folder_text(project, exp_id: int = 1) -> str:
    return "".join(p.read_text(errors="replace") for p in project.run_dir(exp_id).rglob("*") if p.is_file())


def assert_shape(fmt: str, got, *words: str) -> str:
    """The text of one request, checked against ``fmt``'s documented shape."""
    if fmt == "slack":
        body = got.json()
        assert isinstance(body["text"], str) and body["blocks"][0]["type"] == "section"
        text = body["text"]
    elif fmt == "discord":
        body = got.json()
        assert set(body) == {"content", "username"} and len(body["content"]) <= 2000
        text = body["content"]
    elif fmt == "ntfy":
        assert got.headers["Title"].startswith("orch: experiment 1 of tinylm")
        assert got.headers["Priority"] and got.headers["Tags"]
        assert got.headers["Content-Type"].startswith("text/plain")
        text = got.headers["Title"] + "\n" + got.body.decode()
    else:
        body = got.json()
        assert body["schema"] == "orch.notify/1" and body["experiment"] == 1 and body["project"] == "tinylm"
        assert body["target"] == "local" and body["look"] == "orch logs -e 1"
        text = body["text"]
    for word in words:
        assert word in text, (word, text)
    return text


@pytest.mark.parametrize("fmt", ["slack", "discord", "ntfy", "json"])
def test_a_crash_is_sent_by_the_target_in_each_format(project, fmt):
    with Webhook() as hook:
        configure(project, "crash", f'url = "{hook.url}"\nformat = "{fmt}"\non = ["crashed"]')
        deploy(project)  # returns at once: the crash comes after orch has exited
        got = hook.wait(1)[0]
        assert got.path == "/hooks/T0SECRET/B0SECRET/xoxsecret"
        assert_shape(fmt, got, "crashed", "exit code 3", "RuntimeError: CUDA error: out of memory",
                     "orch logs -e 1")
        if fmt == "json":
            details = got.json()["details"]
            assert details["exit_code"] == 3 and details["last_lines"][-1].startswith("RuntimeError")
        time.sleep(0.5)
        assert len(hook.received) == 1  # "on" names crashed only
    state = wait_status(project, 1, ("crashed",))
    assert state["exit_code"] == 3


@pytest.mark.parametrize("fmt", ["slack", "discord", "ntfy", "json"])
def test_a_stall_is_sent_when_the_watchdog_ends_the_run(project, fmt):
    with Webhook() as hook:
        configure(project, "stall", f'url = "{hook.url}"\nformat = "{fmt}"\non = ["stalled"]', run="stall_after = 2")
        deploy(project)
        got = hook.wait(1, timeout=60)[0]
        assert_shape(fmt, got, "stalled", "no new log line for 2 s", "orch logs -e 1")
        if fmt == "ntfy":
            assert got.headers["Priority"] == "high"
    wait_status(project, 1, ("crashed",))


def test_restarted_and_finished_follow_the_attempts(project):
    with Webhook() as hook:
        configure(project, "flaky", f'url = "{hook.url}"\nformat = "json"\non = ["restarted", "finished", "crashed"]',
                  run="restarts = 1\nbackoff = [0.5]")
        deploy(project)
        first, second = hook.wait(2)
        assert first.json()["event"] == "restarted"
        assert first.json()["details"]["exit_code"] == 3 and first.json()["details"]["attempt"] == 2
        assert "restarted (exit code 3, attempt 2 of 2, in 0.5 s)" in first.json()["title"]
        assert second.json()["event"] == "finished" and second.json()["details"]["exit_code"] == 0
    wait_status(project, 1, ("finished",))


@pytest.mark.parametrize("dead", ["closed port", "HTTP 500"])
def test_a_dead_webhook_leaves_the_run_alone_and_shows_in_status(project, dead):
    with Webhook(status=500) as hook:
        url = closed_port_url() if dead == "closed port" else hook.url
        configure(project, "finish", f'url = "{url}"\non = ["finished"]')
        deploy(project)
        state = wait_status(project, 1, ("finished",))
        assert state["exit_code"] == 0
        deadline = time.monotonic() + 30  # three tries, a pause of 1 s then 2 s between them
        while not (project.run_dir(1) / "notify.log").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if dead == "HTTP 500":
            assert len(hook.wait(3)) == 3  # the supervisor tried three times
    entry = json.loads((project.run_dir(1) / "notify.log").read_text().splitlines()[-1])
    assert entry["ok"] is False and entry["tries"] == 3 and entry["event"] == "finished"
    res = project.run("status")
    assert res.returncode == 0, res.stderr
    assert "experiment 1 finished (exit code 0)" in res.stdout
    assert "notifications: 0 sent, 1 failed (last: finished: " in res.stdout
    if dead == "HTTP 500":
        assert "HTTP 500" in res.stdout
    else:
        assert "refused" in res.stdout.lower()
    data = json.loads(project.run("status", "--json").stdout)
    assert data["notify"]["failed"] == 1
    for text in (res.stdout, res.stderr, json.dumps(data), run_folder_text(project)):
        assert "SECRET" not in text and url not in text


def test_the_url_from_a_secret_is_recorded_nowhere(project):
    with Webhook() as hook:
        configure(project, "crash", 'url_secret = "NOTIFY_WEBHOOK"\nformat = "slack"')
        res = project.run("deploy", "-m", "notify", env={"NOTIFY_WEBHOOK": hook.url})
        assert res.returncode == 0, res.stderr
        got = hook.wait(1)[0]
        assert "crashed" in got.json()["text"]
        wait_status(project, 1, ("crashed",))
        listing = project.run("experiments", "show", "1")
        for text in (res.stdout, res.stderr, listing.stdout, listing.stderr, run_folder_text(project)):
            assert "SECRET" not in text
        for path in (project.path / ".orch").rglob("*"):
            if path.is_file():
                assert b"T0SECRET" not in path.read_bytes(), path
        assert "NOTIFY_WEBHOOK" not in (project.run_dir(1) / "launch.json").read_text()


def test_a_missing_url_secret_is_refused_before_anything_changes(project):
    configure(project, "crash", 'url_secret = "NOTIFY_WEBHOOK"')
    res = project.run("deploy")
    assert res.returncode == 2
    assert "error: secret NOTIFY_WEBHOOK" in res.stderr and "hint:" in res.stderr
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


def test_notify_test_sends_from_the_target_and_reports(project):
    with Webhook() as hook:
        configure(project, "finish", f'url = "{hook.url}"\nformat = "discord"')
        res = project.run("notify", "test")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "sent a discord test notification from local: HTTP 200"
        body = hook.wait(1)[0].json()
        assert body["username"] == "orch" and "test notification" in body["content"]
    url = closed_port_url()
    configure(project, "finish", f'url = "{url}"')
    res = project.run("notify", "test")
    assert res.returncode != 0
    assert "error: the webhook did not take the test notification from local (no answer, 3 tries)" in res.stderr
    assert "hint:" in res.stderr
    assert "SECRET" not in res.stdout + res.stderr and url not in res.stdout + res.stderr


def test_notify_test_without_a_webhook_says_how_to_set_one(project):
    project.configure()
    res = project.run("notify", "test")
    assert res.returncode == 2
    assert "error: [notify] sets no webhook" in res.stderr and "hint: add [notify] url" in res.stderr


@pytest.mark.parametrize("setting, message", [
    ('on = ["crashed", "spikes"]', "'spikes' is not an event orch sends; choose among crashed, stalled"),
    ('format = "teams"', "notify.format = 'teams'"),
    ('url = "ftp://hooks.example/T0SECRET"', "notify.url: must be an http:// or https:// URL"),
    ('url = "http://[hooks.example/T0SECRET"', "notify.url: does not parse as a URL"),
    ('url = "https://hooks.example:T0SECRET/x"', "notify.url: does not parse as a URL"),
    ('url = "https://a.example/T0SECRET"\nurl_secret = "HOOK"', "set url or url_secret, not both"),
])
def test_bad_notify_settings_are_clear_errors(project, setting, message):
    configure(project, "finish", setting)
    res = project.run("deploy")
    assert res.returncode == 2, res.stdout
    assert message in res.stderr and "hint:" in res.stderr
    assert "T0SECRET" not in res.stderr
    assert not (project.root / "runs").exists()


BROKEN = "http://[hooks.example/T0SECRET"  # an IPv6 bracket never closed: urllib cannot parse it


@pytest.mark.parametrize("command", [("deploy",), ("notify", "test")])
@pytest.mark.parametrize("source", ["orch.toml", "environment", "--set", "secret"])
def test_a_webhook_url_that_does_not_parse_is_refused_by_every_command(project, command, source):
    """Wherever the URL comes from, a deploy and ``orch notify test`` refuse it before anything changes: exit 2,
    ``error:`` and ``hint:``, no traceback, the URL never shown."""
    setting, env, extra = {"orch.toml": (f'url = "{BROKEN}"', None, ()),
                           "environment": ("", {"ORCH_NOTIFY__URL": BROKEN}, ()),
                           "--set": ("", None, ("--set", f"notify.url={BROKEN}")),
                           "secret": ('url_secret = "NOTIFY_WEBHOOK"', {"NOTIFY_WEBHOOK": BROKEN}, ())}[source]
    configure(project, "finish", setting)
    res = project.run(*command, *extra, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "does not parse as a URL" in res.stderr and "hint:" in res.stderr
    assert "Traceback" not in res.stderr and "T0SECRET" not in res.stdout + res.stderr
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


def test_slow_and_spike_are_read_from_the_log_by_the_supervisor(project):
    with Webhook() as hook:
        configure(project, "rates", f'url = "{hook.url}"\nformat = "json"\non = ["spike", "slow"]')
        deploy(project)
        wait_status(project, 1, ("finished",))  # status reads its metrics: the next run's baseline
        assert hook.received == []  # nothing to compare against, no spike
        deploy(project)
        slow, spike = sorted((r.json() for r in hook.wait(2)), key=lambda m: m["event"])
        assert slow["event"] == "slow"
        assert slow["title"] == "orch: experiment 2 of tinylm is slow (3,000 tok/s, \u221270% vs experiment 1 " \
            "(10,000 tok/s)) on local"
        assert slow["details"]["baseline"] == 10000.0 and slow["details"]["against"] == 1
        assert spike["title"] == "orch: experiment 2 of tinylm has a loss spike (loss 9 at step 30, median 2.01) " \
            "on local"
        assert spike["look"] == "orch logs -e 2"
