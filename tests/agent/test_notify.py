"""The agent's notification pieces: each format's body, the URL kept out of errors, the tries against a real
HTTP server on loopback, and the summary ``status`` shows."""

from __future__ import annotations

import json

import pytest

from orchestrator.agent.watch import notify
from tests.webhook import Webhook, closed_port_url

CONTEXT = {"experiment": 14, "project": "demo", "target": "CT 101 on pve1", "ct": 101, "node": "pve1"}
CRASH = {"exit_code": 1, "reason": "exit code 1", "last_lines": [f"line {i} " + "x" * 280 for i in range(10)]}


def test_a_discord_message_is_cut_to_2000_characters():
    body, headers = notify.payload("discord", "crashed", CONTEXT, CRASH)
    data = json.loads(body)
    assert len(data["content"]) == 2000 and data["content"].endswith("…")
    assert data["content"].startswith("orch: experiment 14 of demo crashed (exit code 1) on CT 101 on pve1\n")
    assert headers == {"Content-Type": "application/json"}


def test_slack_json_and_ntfy_bodies():
    slack = json.loads(notify.payload("slack", "crashed", CONTEXT, CRASH)[0])
    assert slack["text"].startswith("orch: experiment 14 of demo crashed (exit code 1)")
    assert [b["type"] for b in slack["blocks"]] == ["section", "section", "context"]
    assert slack["blocks"][2]["elements"][0]["text"] == "`orch logs -e 14`"
    data = json.loads(notify.payload("json", "stalled", CONTEXT, {"stall_after": 600.0}, now=5.0)[0])
    assert data == {"schema": "orch.notify/1", "event": "stalled", "experiment": 14, "project": "demo",
                    "target": "CT 101 on pve1", "ct": 101, "node": "pve1", "time": 5.0,
                    "details": {"stall_after": 600.0}, "look": "orch logs -e 14",
                    "title": "orch: experiment 14 of demo stalled (no new log line for 600 s) on CT 101 on pve1",
                    "text": "orch: experiment 14 of demo stalled (no new log line for 600 s) on CT 101 on pve1\n"
                            "CT 101, node pve1\nlook: orch logs -e 14"}
    body, headers = notify.payload("ntfy", "finished", CONTEXT, {"exit_code": 0})
    assert headers["Title"] == "orch: experiment 14 of demo finished (exit code 0) on CT 101 on pve1"
    assert (headers["Priority"], headers["Tags"]) == ("default", "white_check_mark")
    assert body.decode() == "CT 101, node pve1\nlook: orch logs -e 14"


def test_redact_removes_the_url_and_its_parts():
    url = "https://hooks.slack.com/services/T0/B0/secret?token=abc123"
    text = f"cannot reach {url}; host hooks.slack.com path /services/T0/B0/secret query token=abc123"
    out = notify.redact(text, url)
    assert "hooks.slack.com" not in out and "secret" not in out and "abc123" not in out


def test_redact_cuts_out_a_url_that_does_not_parse():
    url = "http://[hooks.example/T0SECRET?k=abc123"
    out = notify.redact(f"Invalid IPv6 URL: {url}; path T0SECRET; host [hooks.example; k=abc123", url)
    assert "T0SECRET" not in out and "hooks.example" not in out and "abc123" not in out


def test_post_tries_three_times_then_reports_without_the_url():
    url = closed_port_url()
    res = notify.post(url, b"{}", {}, pause=0.01)
    assert res["ok"] is False and res["tries"] == 3 and res["status"] is None
    assert "refused" in res["error"].lower() and "SECRET" not in res["error"]
    with Webhook(status=500) as hook:
        res = notify.post(hook.url, b"{}", {}, pause=0.01)
        assert (res["ok"], res["status"], res["tries"]) == (False, 500, 3)
        assert len(hook.received) == 3
    with Webhook(status=404) as hook:  # a refusal is final: no second try
        assert notify.post(hook.url, b"{}", {}, pause=0.01)["tries"] == 1
    with Webhook() as hook:
        assert notify.post(hook.url, b'{"a": 1}', {"Content-Type": "application/json"}) == \
            {"ok": True, "status": 200, "tries": 1, "error": None}
        assert hook.received[0].json() == {"a": 1}


def test_summary_counts_and_keeps_the_last_failure(tmp_path):
    assert notify.summary(str(tmp_path)) is None
    notify.log_result(str(tmp_path), "crashed", {"ok": True, "status": 200, "tries": 1, "error": None})
    notify.log_result(str(tmp_path), "finished", {"ok": False, "status": 500, "tries": 3, "error": "HTTP 500 x"})
    got = notify.summary(str(tmp_path))
    assert got["sent"] == 1 and got["failed"] == 1
    assert got["last_failure"]["event"] == "finished" and got["last_failure"]["error"] == "HTTP 500 x"


@pytest.mark.parametrize("spec, message", [
    ({"url": "ftp://x", "format": "json", "on": []}, "notify.url must be an http"),
    ({"url": "http://[x/T0", "format": "json", "on": []}, "notify.url does not parse as a URL"),
    ({"url": "http:///path", "format": "json", "on": []}, "notify.url names no host"),
    ({"url": "http://x/a b", "format": "json", "on": []}, "notify.url holds a space"),
    ({"url": "http://x", "format": "teams", "on": []}, "notify.format must be one of"),
    ({"url": "http://x", "format": "json", "on": ["spikes"]}, "notify.on must list events"),
])
def test_the_agent_refuses_a_bad_notify_argument(spec, message):
    with pytest.raises(notify.AgentFailure, match=message):
        notify.check(spec)


def test_metric_lines_find_a_spike_and_a_slow_rate(tmp_path):
    from orchestrator.agent.metrics import metric_lines

    assert metric_lines.parse("step=3 loss=2.5 tok/s=1200") == {"step": 3.0, "loss": 2.5, "tok_s": 1200.0}
    assert metric_lines.parse("epoch 1 done") == {}
    spikes = metric_lines.Spikes()
    assert [spikes.add(2.0 + 0.01 * (i % 3)) for i in range(20)] == [None] * 20
    assert spikes.add(9.0) == pytest.approx(2.01)
    assert spikes.add(float("nan")) is not None
    rate = metric_lines.Rate(window=3)
    assert [rate.add(v) for v in (10.0, 30.0, 20.0, 40.0)] == [None, None, 20.0, 30.0]


def test_metric_watch_reads_new_lines_and_sends_once(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step=0 loss=1.0 tok/s=99999\n")  # an earlier attempt's line: not this attempt's
    told = notify.Notifier(str(tmp_path), {"format": "json", "on": ["spike", "slow"],
                                           "context": {"baseline": {"experiment": 1, "tok_s": 1000.0}}}, "http://x")
    sent: list = []
    told.send = lambda event, **d: sent.append((event, d))  # type: ignore[method-assign]
    watch = notify.MetricWatch(told, str(log))
    with log.open("a") as fh:
        for step in range(1, 41):
            fh.write(f"step={step} loss={2.0 + 0.01 * (step % 3):.2f} tok/s=400\n")
        fh.write("step=41 loss=9.5 tok/s=4")  # no newline yet: read at the next tick
    watch.tick()
    assert [e for e, _ in sent] == ["slow"]
    assert sent[0][1]["rate"] == 400.0 and sent[0][1]["change_pct"] == -60 and sent[0][1]["step"] == 20.0
    with log.open("a") as fh:
        fh.write("00\nstep=42 loss=9.7 tok/s=400\n")
    watch.tick()
    assert [e for e, _ in sent] == ["slow", "spike"]  # one slow message, one spike in SPIKE_GAP_S
    assert sent[1][1] == {"loss": 9.5, "step": 41.0, "median": 2.01}


def test_an_evaluation_loss_is_never_taken_for_a_training_loss_spike(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    told = notify.Notifier(str(tmp_path), {"format": "json", "on": ["spike"], "context": {}}, "http://x")
    sent: list = []
    told.send = lambda event, **d: sent.append((event, d))  # type: ignore[method-assign]
    watch = notify.MetricWatch(told, str(log))
    with log.open("a") as fh:
        for i in range(30):  # pytorch/examples mnist/main.py's lines: its test loss is far from the training loss
            fh.write(f"Train Epoch: 1 [{i * 640}/60000 ({i}%)]\tLoss: {0.30 + 0.01 * (i % 3):.6f}\n")
        fh.write("\nTest set: Average loss: 9.5000, Accuracy: 1000/10000 (10%)\n\n")
        fh.write("| end of epoch   1 | time: 35.12s | valid loss  9.61 | valid ppl 14913.17\n")
    watch.tick()
    assert sent == []
    with log.open("a") as fh:
        fh.write("Train Epoch: 2 [0/60000 (0%)]\tLoss: 9.500000\n")
    watch.tick()
    assert [e for e, _ in sent] == ["spike"] and sent[0][1]["loss"] == 9.5 and sent[0][1]["step"] == 60000.0
