"""Streamed follow (`log_stream`) on the local target: real runs in tmux, a real agent process per stream.

The cut is a real local transport whose link fails in the middle of a stream, part of a frame delivered:
the follower must resume at the last whole frame, and the output must be the log, byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

from orchestrator.watch import follow as logs
from orchestrator.config import load_settings
from orchestrator.errors import TransportError
from orchestrator.watch.follow import follow
from orchestrator.reach.targets import resolve_target
from orchestrator.reach.transport.local import LocalTransport

# ~3 s of steady output with lines written in two pieces, so a caught-up follower streams it
TRICKLE = """\
import sys, time
out = sys.stdout.buffer
for i in range(600):
    line = f"step={i} loss={1 + (i % 97) / 100:.4f} {'µ' * (i % 7)}{'x' * (i % 40)}\\n".encode()
    out.write(line[:7]); out.flush()
    out.write(line[7:]); out.flush()
    time.sleep(0.005)
"""


class CuttingLink(LocalTransport):
    """A local connection whose streams are cut after ``cut_after`` bytes, halfway through a piece."""

    streams_started = 0
    cuts = 0

    def __init__(self, cut_after: int) -> None:
        super().__init__()
        self.cut_after = cut_after

    def run(self, argv, *, input=None, timeout=None, stall=None, output=None):
        if output is None:
            return super().run(argv, input=input, timeout=timeout, stall=stall)
        CuttingLink.streams_started += 1
        received = [0]

        def cutting(chunk: bytes) -> None:
            if received[0] + len(chunk) >= self.cut_after:
                output(chunk[:len(chunk) // 2])
                CuttingLink.cuts += 1
                raise TransportError("connection reset by peer in the middle of a stream")
            received[0] += len(chunk)
            output(chunk)

        return super().run(argv, input=input, timeout=timeout, stall=stall, output=cutting)


def deploy(project, name: str, source: str) -> int:
    (project.path / name).write_text(source)
    res = project.cli("deploy", "--set", f"project.sources=['{name}']", "--set", f"project.command=python3 {name}",
                      "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["experiment"]["id"]


def test_a_stream_cut_mid_frame_resumes_at_the_last_whole_frame_byte_for_byte(project):
    exp_id = deploy(project, "trickle.py", TRICKLE)
    settings = load_settings(project.path / "orch.toml")
    target = dataclasses.replace(resolve_target(settings), connect=lambda: CuttingLink(cut_after=3000))
    CuttingLink.streams_started = CuttingLink.cuts = 0
    out, notices = bytearray(), []
    result = follow(settings, target, exp_id, write=out.extend, notice=notices.append, follow=True,
                    tail_lines=10**9, poll=0.05, first_backoff=0.05, max_backoff=0.1, max_failures=100,
                    registry=project.registry().registry_id)
    log = (project.run_dir(exp_id) / "train.log").read_bytes()
    assert bytes(out) == log and result.bytes == len(log)
    assert result.state["state"] == "finished"
    assert CuttingLink.cuts >= 2 and result.reconnects == CuttingLink.cuts
    assert sum(n.startswith("connection lost") for n in notices) == result.reconnects


def test_a_caught_up_follower_streams_each_line_as_it_is_written(project):
    """Lines written 0.4 s apart reach the follower within a small part of that, in one agent process."""
    source = ("import sys, time\nfor i in range(8):\n    print(f'tick {i} {time.time():.6f}', flush=True)\n"
              "    time.sleep(0.4)\n")
    exp_id = deploy(project, "tick.py", source)
    settings = load_settings(project.path / "orch.toml")
    target = resolve_target(settings)
    arrivals: list[tuple[float, bytes]] = []
    calls = []
    done = {}

    def run() -> None:
        done["result"] = follow(settings, target, exp_id, write=lambda b: arrivals.append((time.time(), b)),
                                notice=calls.append, follow=True, tail_lines=10**9,
                                registry=project.registry().registry_id)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    lines = [(t, line) for t, chunk in arrivals for line in chunk.splitlines() if line.startswith(b"tick")]
    assert [int(line.split()[1]) for _, line in lines] == list(range(8))
    lags = sorted(t - float(line.split()[2]) for t, line in lines[2:])  # the first ones were read, not streamed
    assert lags[len(lags) // 2] < 0.25, lags  # polling every 0.3 s would give a median near 0.15-0.3 s
    assert done["result"].reads < 8  # not one read per poll


def test_streaming_off_falls_back_to_polling_with_the_same_output(project, monkeypatch):
    exp_id = deploy(project, "trickle.py", TRICKLE)
    settings = load_settings(project.path / "orch.toml")
    monkeypatch.setattr(logs, "STREAMING", False)
    out = bytearray()
    result = follow(settings, resolve_target(settings), exp_id, write=out.extend, notice=lambda _: None,
                    follow=True, tail_lines=10**9, poll=0.05, registry=project.registry().registry_id)
    assert bytes(out) == (project.run_dir(exp_id) / "train.log").read_bytes()
    assert result.reads > 3  # one read per poll (each one slow on a loaded machine)
