"""orchestrator.watch.logparse on the lines real training frameworks print, each named by the source that prints it.

The Hugging Face and Lightning logs in tests/data/logs were captured from real runs (the scripts beside them);
the other lines are as the named source formats them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from orchestrator.watch.logparse import PARSER_VERSION, Parser, parser_key

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"


def parse(line: str) -> dict | None:
    return Parser().parse_line(line)


# -- nanoGPT (karpathy/nanoGPT train.py) ----------------------------------------------------------


def test_nanogpt_iteration_line_gives_step_loss_and_steps_per_second() -> None:
    # print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")
    assert parse("iter 10: loss 2.3456, time 5.86ms, mfu 1.23%") == pytest.approx(
        {"step": 10, "loss": 2.3456, "steps_s": 1000 / 5.86, "mfu": 1.23})


def test_nanogpt_before_mfu_is_measured_has_no_mfu() -> None:
    # running_mfu starts at -1.0, so the first lines say "mfu -100.00%"
    assert parse("iter 0: loss 4.2874, time 30728.83ms, mfu -100.00%") == pytest.approx(
        {"step": 0, "loss": 4.2874, "steps_s": 1000 / 30728.83})


def test_nanogpt_eval_line_is_a_validation_loss_not_the_training_loss() -> None:
    # print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    assert parse("step 2000: train loss 1.0412, val loss 1.0823") == {"step": 2000.0, "val_loss": 1.0823}


# -- Hugging Face Trainer (huggingface/transformers src/transformers/trainer_callback.py) -----------


@pytest.mark.parametrize(("line", "expected"), [
    # ProgressCallback.on_log, transformers >= 4.47: floats written as f"{v:.4g}" strings
    ("{'loss': '3.898', 'grad_norm': '0.8794', 'learning_rate': '3.875e-05', 'epoch': '0.625'}",
     {"loss": 3.898, "grad_norm": 0.8794, "lr": 3.875e-05, "epoch": 0.625}),
    # older releases: str(logs) with plain floats; with numpy 2 some values are numpy scalars
    ("{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}",
     {"loss": 2.31, "grad_norm": 1.2, "lr": 5e-05, "epoch": 0.5}),
    ("{'loss': np.float64(2.31), 'grad_norm': np.float32(1.25), 'learning_rate': 5e-05, 'epoch': 0.5}",
     {"loss": 2.31, "grad_norm": 1.25, "lr": 5e-05, "epoch": 0.5}),
    ("{'eval_loss': '3.896', 'eval_runtime': '0.0037', 'eval_samples_per_second': '2190', "
     "'eval_steps_per_second': '273.7', 'epoch': '1.25'}", {"val_loss": 3.896, "epoch": 1.25}),
])
def test_hugging_face_log_dicts(line: str, expected: dict) -> None:
    assert parse(line) == pytest.approx(expected)


def test_hugging_face_summary_line_is_a_mean_loss_and_a_step_rate() -> None:
    # Trainer.train's final log: train_loss is the mean over the run, so it is not the last loss
    line = ("{'train_runtime': '0.3818', 'train_samples_per_second': '419.1', 'train_steps_per_second': '104.8', "
            "'train_loss': '3.896', 'epoch': '2.5'}")
    assert parse(line) == pytest.approx({"runtime_s": 0.3818, "steps_s": 104.8, "mean_loss": 3.896, "epoch": 2.5})


def test_hugging_face_tqdm_bar_gives_step_total_and_rate() -> None:
    assert parse("  5%|▌         | 10/200 [00:05<01:30,  2.10it/s]") == pytest.approx(
        {"step": 10, "total_steps": 200, "steps_s": 2.10})
    assert parse(" 12%|█▎        | 25/200 [01:15<08:45,  3.00s/it]") == pytest.approx(
        {"step": 25, "total_steps": 200, "steps_s": 1 / 3.0})


def test_a_bar_that_has_not_started_gives_its_total_but_no_step() -> None:
    assert parse("  0%|          | 0/40 [00:00<?, ?it/s]") == {"total_steps": 40.0}


def test_a_captured_hugging_face_run_reads_step_by_step() -> None:
    text = (LOGS / "hf_trainer_tqdm.log").read_text(encoding="utf-8")
    events = Parser().parse_lines(text.split("\n"))
    losses = [e["loss"] for e in events if "loss" in e]
    assert losses == [3.898, 3.897, 3.895, 3.895]  # logging_steps=10 of 40
    steps = [e["step"] for e in events if "step" in e and e.get("total_steps") == 40]
    assert steps[0] == 1 and steps[-1] == 40 and steps == sorted(steps)
    assert [e["val_loss"] for e in events if "val_loss" in e] == [3.896, 3.896]
    assert events[-1] == pytest.approx({"step": 40, "total_steps": 40, "steps_s": 105.76})  # the unterminated end
    assert not any("tok_s" in e for e in events)  # it/s counts steps: never passed off as tokens


# -- PyTorch Lightning (Lightning-AI/pytorch-lightning src/lightning/pytorch/callbacks/progress/) ----


def test_lightning_tqdm_bar_with_its_postfix_metrics() -> None:
    # tqdm_progress.py: desc f"Epoch {trainer.current_epoch}", postfix = get_metrics() (v_num, logged metrics)
    line = "Epoch 0:  45%|████▌     | 45/100 [00:03<00:04, 13.2it/s, v_num=0, train_loss=2.310]"
    assert parse(line) == pytest.approx({"epoch": 0, "step": 45, "steps_s": 13.2, "loss": 2.31})


def test_lightning_counts_batches_per_epoch_so_the_step_adds_the_epochs_before() -> None:
    line = "Epoch 3:  10%|█         | 10/100 [00:01<00:08, 11.0it/s, v_num=1, train_loss=1.200, val_loss=1.500]"
    assert parse(line) == pytest.approx({"epoch": 3, "step": 310, "steps_s": 11.0, "loss": 1.2, "val_loss": 1.5})


@pytest.mark.parametrize("line", [
    "Validation DataLoader 0:  50%|█████     | 5/10 [00:00<00:00, 20.1it/s]",
    "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 49.67it/s]",
    "Testing DataLoader 0:  30%|███       | 3/10 [00:00<00:00, 30.0it/s]",
])
def test_evaluation_bars_are_not_training_steps(line: str) -> None:
    assert parse(line) is None


def test_carriage_returns_make_one_update_each_and_the_last_counts_for_now() -> None:
    line = ("\rEpoch 0:   5%|▌         | 1/20 [00:00<00:00, 220.66it/s, train_loss=1.440]"
            "\rEpoch 0:  10%|█         | 2/20 [00:00<00:00, 256.75it/s, train_loss=0.731]")
    events = list(Parser().events(line))
    assert [e["step"] for e in events] == [1, 2] and [e["loss"] for e in events] == [1.44, 0.731]
    assert parse(line) == pytest.approx({"epoch": 0, "step": 2, "steps_s": 256.75, "loss": 0.731})


def test_a_captured_lightning_run_reads_both_epochs() -> None:
    text = (LOGS / "lightning_tqdm.log").read_text(encoding="utf-8")
    events = Parser().parse_lines(text.split("\n"))
    steps = [e["step"] for e in events if "step" in e]
    assert steps[0] == 1 and max(steps) == 40  # 2 epochs of 20 batches; validation bars left out
    assert [e["loss"] for e in events if "loss" in e][-1] == 1.6
    assert events[-1] == {"step": 40, "epoch": 1, "val_loss": 0.939}  # the validation's, at the step it ran after


def test_a_lightning_step_is_one_event_with_that_steps_loss() -> None:
    # tqdm_progress.py on_train_batch_end: _update_n(bar, n) redraws the new count with the old postfix, then
    # bar.set_postfix(self.get_metrics(...)) redraws it with this step's loss: two \r updates per step
    text = (LOGS / "lightning_tqdm.log").read_bytes().decode()
    own: dict[float, float] = {}  # each step's loss: the one its last update shows
    for update in text.replace("\n", "\r").split("\r"):
        m = re.match(r"Epoch (\d+):.*\| (\d+)/(\d+) \[.*train_loss=([\d.]+)", update)
        if m and int(m[2]):
            own[int(m[1]) * int(m[3]) + int(m[2])] = float(m[4])
    lines = text.splitlines()  # as orch status reads a log: a \r ends an update
    for cut in (None, 40, 41):  # read at once, and in two reads (between a step's two updates, and after them)
        parser = Parser()
        events = parser.parse_lines(lines if cut is None else lines[:cut])
        if cut is not None:
            events += Parser(state=parser.state()).parse_lines(lines[cut:])
        losses = [(e["step"], e["loss"]) for e in events if "loss" in e]
        assert losses == sorted(own.items())  # one per step, each its own loss
        val = [(e["step"], e["val_loss"]) for e in events if "val_loss" in e]
        assert val == [(20, 0.938), (40, 0.939)]  # each validation once, at the step it ran after


def test_a_captured_lightning_rich_bar() -> None:
    # rich_progress.py (RichProgressBar, the default when rich is installed):
    # "Epoch 1/1 ━━━ 20/20 0:00:00 • ..."
    text = (LOGS / "lightning_rich.log").read_text(encoding="utf-8")
    events = Parser().parse_lines(text.split("\n"))
    assert events[0] == pytest.approx({"epoch": 1, "step": 40, "total_steps": 40, "steps_s": 413.71, "loss": 1.594})


# -- torchtitan (pytorch/torchtitan torchtitan/components/metrics.py, MetricsProcessor.log) --------


def test_torchtitan_line_with_colours_and_thousands_separators() -> None:
    # f"{color.red}step: {step:2}  {color.green}loss: {loss:7.4f}  {color.orange}grad_norm: {grad_norm:7.4f}  "
    # f"{color.turquoise}memory: {gib:5.2f}GiB({pct:.2f}%)  {color.blue}tps: {round(tps):,}  "
    # f"{color.cyan}tflops: {tflops:,.2f}  {color.magenta}mfu: {mfu:.2f}%{color.reset}"
    line = ("\x1b[31mstep: 10  \x1b[32mloss:  7.8213  \x1b[33mgrad_norm:  1.2345  \x1b[96mmemory: 12.34GiB(15.60%)"
            "  \x1b[34mtps: 12,345  \x1b[36mtflops: 1,012.50  \x1b[35mmfu: 32.41%\x1b[39m")
    assert parse(line) == pytest.approx({"step": 10, "loss": 7.8213, "grad_norm": 1.2345, "tok_s": 12345,
                                         "tflops": 1012.5, "mfu": 32.41})


def test_torchtitan_line_inside_its_logger_prefix() -> None:
    line = ("[rank0]:[titan] 2025-03-01 10:00:00,000 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss: 12.2345  "
            "\x1b[33mmemory: 20.01GiB(25.32%)  \x1b[34mtps: 1,234  \x1b[36mtflops: 12.34  \x1b[35mmfu: 5.12%\x1b[39m")
    assert parse(line) == pytest.approx({"step": 1, "loss": 12.2345, "tok_s": 1234, "tflops": 12.34, "mfu": 5.12})


def test_torchtitan_before_it_said_tps() -> None:
    # early torchtitan train.py: f"{color.blue}wps: {round(wps):,}  " (words, i.e. tokens, per second)
    line = "\x1b[31mstep:  5  \x1b[32mloss:  9.1234  \x1b[33mmemory: 10.00GiB(12.50%)  \x1b[34mwps: 2,048  \x1b[35mmfu: 3.00%"
    assert parse(line) == pytest.approx({"step": 5, "loss": 9.1234, "tok_s": 2048, "mfu": 3.0})


# -- Megatron-LM (NVIDIA/Megatron-LM megatron/training/training.py, training_log) -------------------

MEGATRON = (" [2025-08-01 07:19:50] iteration        2/    5000 | consumed samples:          256 | "
            "elapsed time per iteration (ms): 12936.1 | throughput per GPU (TFLOP/s/GPU): 118.7 | "
            "learning rate: 1.395349E-07 | global batch size:   128 | lm loss: 1.044022E+01 | loss scale: 1.0 | "
            "grad norm: 26.305 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def test_megatron_line_gives_step_total_loss_lr_and_steps_per_second() -> None:
    assert parse(MEGATRON) == pytest.approx({"step": 2, "total_steps": 5000, "steps_s": 1000 / 12936.1,
                                             "tflops": 118.7, "lr": 1.395349e-07, "loss": 10.44022,
                                             "grad_norm": 26.305})


def test_megatron_validation_line() -> None:
    # evaluate_and_print_results: f" validation loss at {prefix} | lm loss value: {:.6E} | lm loss PPL: ... |"
    line = " validation loss at iteration 100 on validation set | lm loss value: 2.345678E+00 | lm loss PPL: 1.04E+01 |"
    assert parse(line) == pytest.approx({"step": 100, "val_loss": 2.345678})


# -- the generic formats, user patterns, and what is not a metric ---------------------------------


def test_key_value_and_json_lines_still_read() -> None:
    assert parse("step=12 loss=3.2141 Ktok/s=15.2 epoch=0") == {"step": 12, "loss": 3.2141, "tok_s": 15200, "epoch": 0}
    assert parse('{"step": 3, "loss": 4.5, "tokens_per_sec": 900}') == {"step": 3, "loss": 4.5, "tok_s": 900}


def test_user_patterns_see_the_line_without_colour_codes() -> None:
    parser = Parser({"loss": r"L=([0-9.]+)"})
    assert parser.parse_line("\x1b[1mL=\x1b[0m0.25") == {"loss": 0.25}


@pytest.mark.parametrize("line", [
    "Training: |          | 0/? [00:00<?, ?it/s]",
    "iteration took long",
    "`Trainer.fit` stopped: `max_epochs=2` reached.",
    "{'train_batch_size': 'auto'}",
    "saving checkpoint to out",
])
def test_lines_without_metrics(line: str) -> None:
    assert parse(line) is None


def test_the_parser_key_changes_with_the_patterns() -> None:
    assert parser_key(None) == parser_key({}) != parser_key({"loss": "L=([0-9.]+)"})
    assert parser_key({"a": "x(1)", "b": "y(2)"}) == parser_key({"b": "y(2)", "a": "x(1)"})
    assert parser_key(None).startswith(f"{PARSER_VERSION}:")


def test_logparse_does_no_io() -> None:
    tree = ast.parse((Path(__file__).resolve().parents[2] / "orchestrator" / "watch" / "logparse.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"os", "subprocess", "socket", "sqlite3", "pathlib", "io", "shutil"}


def test_plain_drops_colour_codes_and_cursor_moves() -> None:
    from orchestrator.watch.logparse import plain

    assert plain("\x1b[31mstep: 1  \x1b[32mloss: 2.5\x1b[39m\x1b[A") == "step: 1  loss: 2.5"
    assert plain("no escapes") == "no escapes"
