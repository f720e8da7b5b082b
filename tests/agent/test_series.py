"""The run's metric series its supervisor keeps beside the log (``agent/run/series.py``): every event once, through
a log that grows a piece at a time, a record half written at a crash, a state saved before its records, and a
supervisor started again; and the real supervisor keeping it for a run on the local target."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from orchestrator.agent.metrics import metric_lines
from orchestrator.agent.run import series
from tests.conftest import wait_for

LINES = [
    "Epoch 1/3",
    *(f"step={i} loss={2.0 / i:.4f} tok/s={1000 + i} lr=3.0e-04" for i in range(1, 30)),
    "eval: loss=0.5000 acc=0.9000",
    "Epoch 0:  10%|█         | 2/20 [00:00<00:00, 266.20it/s, train_loss=1.440]\r"
    "Epoch 0:  10%|█         | 2/20 [00:00<00:00, 256.75it/s, train_loss=0.731]\r"
    "Epoch 0:  15%|█▌        | 3/20 [00:00<00:00, 281.43it/s, train_loss=0.731]\r"
    "Epoch 0:  15%|█▌        | 3/20 [00:00<00:00, 274.72it/s, train_loss=0.884]",
    '{"step": 40, "loss": 0.25, "time": 1700000000.5}',
    "| End of training | test loss  5.00 | test ppl   148.41",
    "step=41 loss=0.1000 tok/s=1041",
]


def expected() -> list[dict]:
    reader = metric_lines.Reader()
    return [e for line in LINES for piece in line.split("\r") for e in reader.events(piece)]


def records(run: Path) -> list:
    return series.records((run / series.FILE).read_bytes())


def grow(run: Path, keeper_of, pieces: int, seed: int = 0) -> None:
    """Writes the log in ``pieces`` random cuts (mid-line too), a tick after each; ``keeper_of`` gives the keeper
    that ticks (a test swaps it for a new one, as a supervisor started again)."""
    data = ("\n".join(LINES) + "\n").encode()
    cuts = sorted(random.Random(seed).sample(range(1, len(data)), pieces - 1)) + [len(data)]
    at = 0
    for i, cut in enumerate(cuts):
        with open(run / series.LOG, "ab") as fh:
            fh.write(data[at:cut])
        at = cut
        keeper_of(i).tick()


def test_every_event_once_as_the_log_grows_with_its_offset_and_time(tmp_path):
    keeper = series.Series(str(tmp_path))
    grow(tmp_path, lambda i: keeper, 17)
    kept = records(tmp_path)
    assert [r[2] for r in kept] == expected()
    log = (tmp_path / series.LOG).read_bytes()
    assert all(log[r[0] - 1:r[0]] in (b"\n", b"\r") for r in kept)  # each at the end of its line
    assert [r[0] for r in kept] == sorted(r[0] for r in kept)
    # a reader carries its byte offset and reads only what is new
    context: dict = {}
    first, at = series.read(str(tmp_path), 0, max_bytes=200, context=context)
    rest, end = series.read(str(tmp_path), at, context=context)
    assert first + rest == kept and end == (tmp_path / series.FILE).stat().st_size


def test_a_supervisor_started_again_after_a_crash_loses_and_doubles_nothing(tmp_path, monkeypatch):
    want = expected()
    for seed in range(8):
        run = tmp_path / f"run{seed}"
        run.mkdir()
        rng = random.Random(seed)
        monkeypatch.setattr(series, "SAVE_EVERY_S", rng.choice([0.0, 3600.0]))  # the state saved each tick, or never
        keeper = [series.Series(str(run))]
        path, state = run / series.FILE, run / series.STATE

        def ticker(i: int):
            class Crashing:  # a tick, then maybe the crash: mid-write (a record cut), or before the state's save
                @staticmethod
                def tick() -> None:
                    size = path.stat().st_size if path.exists() else 0
                    saved = state.read_bytes() if state.exists() else None
                    keeper[0].tick()
                    if rng.random() < 0.4:
                        now = path.stat().st_size if path.exists() else 0
                        if now > size and rng.random() < 0.7:
                            os.truncate(path, rng.randint(size, now - 1))
                        if saved is None:
                            state.unlink(missing_ok=True)
                        else:
                            state.write_bytes(saved)
                        keeper[0] = series.Series(str(run))  # the supervisor started again
            return Crashing

        grow(run, ticker, 23, seed)
        series.Series(str(run)).tick(final=True)
        assert [r[2] for r in records(run)] == want, f"seed {seed}"
        # the summary saved with the state counts each event once however often the supervisor started again
        assert json.loads(state.read_text())["summary"] == summary_of(want), f"seed {seed}"


def summary_of(events: list[dict]) -> dict:
    """The summary of ``events`` read by one supervisor that never stopped."""
    one = series.Summary(None)
    for event in events:
        one.add({k: int(v) if v.is_integer() else v for k, v in event.items()})
    return one.saved()


def test_the_state_sums_the_series_up_to_its_offset(tmp_path):
    keeper = series.Series(str(tmp_path))
    grow(tmp_path, lambda i: keeper, 5)
    keeper.tick(final=True)
    saved = json.loads((tmp_path / series.STATE).read_text())["summary"]
    kept = [r[2] for r in records(tmp_path)]
    assert saved["events"] == len(kept) and saved["step"] == 41  # the last step, after the evaluation lines
    losses = [e["loss"] for e in kept if "loss" in e]
    assert saved["last"]["loss"] == 0.1 and saved["min"]["loss"] == min(losses) and saved["max"]["loss"] == 2.0
    assert saved["last"]["val_acc"] == 0.9 and saved["last"]["test_ppl"] == 148.41
    assert series.answer(str(tmp_path), 0, 100)["summary"] == saved  # a status asks for it with the series


def test_the_last_line_without_its_newline_is_kept_when_the_run_ends(tmp_path):
    (tmp_path / series.LOG).write_text("step=1 loss=2.0\nstep=2 loss=1.5")
    keeper = series.Series(str(tmp_path))
    keeper.tick()
    assert [r[2] for r in records(tmp_path)] == [{"step": 1.0, "loss": 2.0}]
    keeper.tick(final=True)
    assert [r[2] for r in records(tmp_path)] == [{"step": 1.0, "loss": 2.0}, {"step": 2.0, "loss": 1.5}]
    state = json.loads((tmp_path / series.STATE).read_text())
    assert state["log"] == os.path.getsize(tmp_path / series.LOG)


def test_the_supervisor_keeps_the_series_of_a_real_run(project):
    assert project.run("deploy", "--wait").returncode == 0
    run = project.run_dir(1)

    def saved() -> bool:  # the supervisor's last tick, as it ends (deploy --wait may answer just before)
        state = json.loads((run / series.STATE).read_text()) if (run / series.STATE).exists() else {}
        return (run / "exit.json").exists() and state.get("log") == (run / series.LOG).stat().st_size

    wait_for(saved, timeout=30, what="the series' last save")
    text = (run / series.LOG).read_text()
    reader = metric_lines.Reader()
    want = [e for line in text.split("\n") for piece in line.split("\r") for e in reader.events(piece)]
    kept = records(run)
    assert [r[2] for r in kept] == want and any("loss" in e for e in want)


def test_the_last_tick_reads_the_log_to_its_end_however_far_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(series, "READ_MAX", 64)  # a log written faster than the ticks read it
    (tmp_path / series.LOG).write_text("".join(f"step={i} loss={1.0 / i:.4f}\n" for i in range(1, 200)))
    keeper = series.Series(str(tmp_path))
    keeper.tick()
    assert 0 < len(records(tmp_path)) < 10
    keeper.tick(final=True)
    assert [r[2]["step"] for r in records(tmp_path)] == list(range(1, 200))
    assert json.loads((tmp_path / series.STATE).read_text())["log"] == (tmp_path / series.LOG).stat().st_size


def test_the_series_is_smaller_than_its_log(tmp_path):
    # a shape's names once, then each event as its offset, its shape and its values: smaller than the lines it
    # was read from, and read back to the very events the lines give
    rng = random.Random(0)
    lines = []
    for i in range(1, 3000):
        loss = 4.0 * 0.9995 ** i + rng.gauss(0, 0.02)
        lines.append(rng.choice([f"step={i} loss={loss:.4f} tok/s={rng.randint(10000, 16000)} lr=3.0e-04 epoch=0",
                                 f"[2026-11-29 09:32:22] step: {i}/1000000 | loss: {loss:.4f} | grad_norm: 0.93",
                                 json.dumps({"step": i, "loss": round(loss, 4), "lr": 3e-4, "time": 1.7e9 + i}),
                                 "validation started"]))
    (tmp_path / series.LOG).write_text("\n".join(lines) + "\n")
    series.Series(str(tmp_path)).tick(final=True)
    size, log = (tmp_path / series.FILE).stat().st_size, (tmp_path / series.LOG).stat().st_size
    assert size < 0.8 * log, (size, log)
    reader = metric_lines.Reader()
    assert [r[2] for r in records(tmp_path)] == [e for line in lines for e in reader.events(line)]


def test_an_older_supervisors_records_read_beside_the_new_ones(tmp_path):
    # a run whose supervisor was an older orch's, then this one's after a restart: both kinds of line read in order
    old = b'[12,1700000000.5,{"step":1,"loss":2.5}]\n'
    new = b'{"t":1700000001.25}\n{"id":0,"names":["step","loss"]}\n[30,0,2,2.25]\n'
    assert series.records(old + new) == [[12, 1700000000.5, {"step": 1, "loss": 2.5}],
                                         [30, 1700000001.25, {"step": 2, "loss": 2.25}]]
    (tmp_path / series.FILE).write_bytes(old + new)
    assert series.Series(str(tmp_path))._last_record() == (30, 1)


def test_the_series_gives_the_events_the_controllers_log_reader_gives(tmp_path):
    # the supervisor's series, read a tick at a time as the log grows, against the controller's raw-log reader
    # (watch.logparse.Parser, which reads old runs and [metrics] patterns) on the same log: train, evaluation and
    # summary lines of several formats, JSON lines, progress bars
    from orchestrator.watch.logparse import Parser

    rng = random.Random(1)
    lines = list(LINES)
    for i in range(1, 1500):
        loss = 3.0 * 0.999 ** i + rng.gauss(0, 0.01)
        lines.append(rng.choice([
            f"step={i} loss={loss:.4f} tok/s={rng.randint(900, 1100)} lr=3.0e-04",
            f"iter {i}: loss {loss:.4f}, time {rng.uniform(40, 60):.2f}ms, mfu {rng.uniform(30, 40):.2f}%",
            json.dumps({"step": i, "loss": round(loss, 4), "val_loss": round(loss + 0.1, 4), "time": 1.7e9 + i}),
            f"[2026-11-29 09:32:22] step: {i}/1500 | loss: {loss:.4f} | grad_norm: 0.93 | Ktok/s: 12.1",
            f"| end of epoch {i // 100:3d} | time: 35.12s | valid loss {loss:5.2f} | valid ppl {2 ** loss:8.2f}",
            "Test set: Average loss: 0.0500, Accuracy: 9800/10000 (98%)",
            "saving checkpoint to out",
        ]))
    data = ("\n".join(lines) + "\n").encode()
    keeper, at = series.Series(str(tmp_path)), 0
    for cut in sorted(rng.sample(range(1, len(data)), 40)) + [len(data)]:
        with open(tmp_path / series.LOG, "ab") as fh:
            fh.write(data[at:cut])
        at = cut
        keeper.tick()
    keeper.tick(final=True)
    assert [r[2] for r in records(tmp_path)] == Parser().parse_lines(lines)


def test_a_chunk_written_as_columns_is_written_as_event_by_event(tmp_path, monkeypatch):
    # the writer takes the reader's columns (series_rows.Rows.columns) where it can: the file and the summary are
    # those of writing each event on its own, through every case that goes an event at a time (a value not finite,
    # a number past 1e15, a progress bar's counters, a step total of 0, more names than the summary keeps, a line
    # of several updates, a JSON number no JSON reader takes)
    from orchestrator.agent.run import series_rows

    rng = random.Random(2)
    lines = list(LINES)
    for i in range(1, 9000):
        loss = 3.0 * 0.999 ** (i % 3000) + rng.gauss(0, 0.01)
        lines.append(rng.choice([
            f"step={i} loss={loss:.4f} tok/s={rng.randint(900, 1100)} lr=3.0e-04",
            f"step={i} loss={loss:.4f} tok/s={rng.randint(900, 1100)} lr=3.0e-04",
            f"{{\"step\": {i}, \"loss\": {loss:.4f}, \"time\": {1.7e9 + i}}}",
            f"{{\"step\": 0{i % 9}, \"loss\": {loss:.4f}, \"time\": {1.7e9 + i}}}",
            f"step={i} m{i % 90}_loss={loss:.3f}",
            f"step={i} loss={loss:.4f}\rstep={i} loss={loss / 2:.4f} val_loss={loss:.2f}",
            f"[{i % 50:2d}/{50 if i % 11 else 0}] loss: {loss:.3f}",
            "Epoch 3/10",
            "saving checkpoint to out",
            # (what goes an event at a time: in the first chunks only, so that the later ones go as columns)
            *([f"step={i} loss={'nan' if i % 7 else 'inf'} lr=3.0e-04", f"step={i} tokens={10 ** 15 + i} loss=1.5",
               f"[{i % 50:2d}/50] steps/s: 2.5"] if i < 3000 else []),
        ]))
    data = ("\n".join(lines) + "\n").encode()

    def kept(run: Path) -> tuple[list[bytes], dict]:
        run.mkdir()
        (run / series.LOG).write_bytes(data)
        keeper = series.Series(str(run))
        keeper.tick(final=True)
        written = [line for line in (run / series.FILE).read_bytes().splitlines() if not line.startswith(b'{"t"')]
        return written, json.loads((run / series.STATE).read_text())

    columns, tables = series_rows.Rows.columns, []
    monkeypatch.setattr(series_rows.Rows, "columns", lambda self, table: tables.append(columns(self, table)) or
                        tables[-1])
    together = kept(tmp_path / "columns")
    assert True in tables and False in tables
    monkeypatch.setattr(series_rows.Rows, "columns", lambda self, table: False)
    assert together == kept(tmp_path / "events")
    assert len(together[1]["summary"]["last"]) == series_rows.MAX_KEYS


def test_the_series_read_from_a_log_offset_gives_the_records_of_the_lines_after_it(tmp_path):
    # what a read of the log's last lines asks of the series (log_read with tail_lines and series_offset): its
    # records past that offset in the log, after the shapes and the time they need from before them
    lines = [f"step={i} loss={1 / i:.4f}" if i % 5 else f'{{"step": {i}, "acc": 0.5}}' for i in range(1, 3000)]
    data = ("\n".join(lines) + "\n").encode()
    (tmp_path / series.LOG).write_bytes(data)
    keeper = series.Series(str(tmp_path))
    for cut in (len(data) // 3, len(data)):
        (tmp_path / series.LOG).write_bytes(data[:cut])
        keeper.tick(final=True)
    whole = (tmp_path / series.FILE).read_bytes()
    kept = series.records(whole)
    for offset in [0, 5, 17, len(data) // 3, len(data) // 2, len(data) - 3, len(data)] + \
            random.Random(3).sample(range(len(data)), 20):
        start, before = series.after(str(tmp_path), offset)
        got = series.records(before + whole[start:])
        assert got == [r for r in kept if r[0] > offset], offset


def test_an_agent_call_that_reads_no_log_loads_no_metric_reader():
    # every agent call is a process of its own (a status's too): only the supervisor, its watchers and the guard
    # read metrics, and they import the reader when they start
    import subprocess
    import sys

    code = ("import sys, orchestrator.agent.__main__\n"
            "print(sorted(m for m in sys.modules if m.startswith('orchestrator.agent.metrics.')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"
