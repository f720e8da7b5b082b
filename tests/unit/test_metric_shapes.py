"""Logs of public training scripts, read with no configuration: each excerpt is rendered here from the format
string in the named project's file (the comment above it quotes the string), and read as ``orch status`` reads a
log (``watch.logparse.Parser``, which is the agent's ``metric_lines.Reader`` plus the user's patterns).

For each: the training loss is ``loss``, an evaluation's loss ``val_loss``/``test_loss`` (never the training
loss), and lr and a throughput where the line prints them.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.metrics import metric_lines
from orchestrator.watch.logparse import Parser


def read(lines: list[str]) -> list[dict]:
    parser = Parser()
    return [parser.parse_line(line) for line in lines]


# -- pytorch/examples word_language_model/main.py ---------------------------------------------------------------


def test_word_language_model() -> None:
    # print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | loss {:5.2f} | ppl {:8.2f}'...)
    train = '| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | loss {:5.2f} | ppl {:8.2f}'
    # print('| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | valid ppl {:8.2f}'...)
    end = '| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | valid ppl {:8.2f}'
    # print('| End of training | test loss {:5.2f} | test ppl {:8.2f}'...)
    final = '| End of training | test loss {:5.2f} | test ppl {:8.2f}'
    events = read([train.format(1, 200, 2983, 20, 11.27, 7.62, math.exp(7.62)),
                   end.format(1, 35.12, 5.61, math.exp(5.61)),
                   train.format(2, 200, 2983, 20, 11.0, 5.5, math.exp(5.5)),
                   final.format(5.0, math.exp(5.0))])
    assert events[0] == pytest.approx({"epoch": 1, "step": 200, "lr": 20.0, "loss": 7.62, "ppl": 2038.56,
                                       "steps_s": 1000 / 11.27}, rel=1e-4)
    assert events[1] == pytest.approx({"epoch": 1, "val_loss": 5.61, "val_ppl": 273.14}, rel=1e-4)
    assert events[2]["step"] == 2983 + 200  # the batch counter restarts each epoch: epochs count from 1
    assert events[3] == pytest.approx({"test_loss": 5.0, "test_ppl": 148.41}, rel=1e-4)


# -- pytorch/examples mnist/main.py ------------------------------------------------------------------------------


def test_mnist() -> None:
    # print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(epoch, batch_idx * len(data), ...))
    train = 'Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'
    # print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(test_loss, correct, ...))
    test = '\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'
    lines = [train.format(1, 0, 60000, 0, 2.30), train.format(1, 38400, 60000, 64, 0.336354),
             *test.format(0.05, 9800, 10000, 98).split("\n"), train.format(2, 640, 60000, 1, 0.1)]
    events = [e for e in read(lines) if e]
    assert events[1] == {"epoch": 1, "step": 38400, "loss": 0.336354}  # step: samples seen, as the line counts
    assert events[2] == {"test_loss": 0.05, "test_acc": 0.98}  # not the training loss
    assert events[3]["step"] == 60000 + 640


# -- pytorch/examples imagenet/main.py (AverageMeter, ProgressMeter) ---------------------------------------------


def test_imagenet_progress_meter() -> None:
    # AverageMeter: fmtstr = '{name} {val' + self.fmt + '} ({avg' + self.fmt + '})'; ProgressMeter.display:
    # print('\t'.join([self.prefix + '[{:4d}/5005]'.format(batch)] + [str(meter) for meter in self.meters]))
    meters = "\t".join(["Time {:6.3f} ({:6.3f})".format(0.123, 0.456), "Data {:6.3f} ({:6.3f})".format(0.001, 0.002),
                        "Loss {:.4e} ({:.4e})".format(6.9077, 6.9088), "Acc@1 {:6.2f} ({:6.2f})".format(0, 0.1),
                        "Acc@5 {:6.2f} ({:6.2f})".format(0, 0.49)])
    val = "\t".join(["Time {:6.3f} ({:6.3f})".format(0.1, 0.2), "Loss {:.4e} ({:.4e})".format(1.0234, 1.1),
                     "Acc@1 {:6.2f} ({:6.2f})".format(75, 76), "Acc@5 {:6.2f} ({:6.2f})".format(92, 93)])
    events = read(["Epoch: [0][  10/5005]\t" + meters, "Test: [ 10/196]\t" + val,
                   # display_summary: print(' '.join([" *"] + [meter.summary() ...])), '{name} {avg:.3f}'
                   " ".join([" *", "", "", "Acc@1 {:.3f}".format(76.13), "Acc@5 {:.3f}".format(92.862)])])
    assert events[0] == pytest.approx({"epoch": 0, "step": 10, "loss": 6.9077, "acc1": 0.0, "acc5": 0.0,
                                       "steps_s": 1 / 0.123})
    assert events[1] == pytest.approx({"test_loss": 1.0234, "test_acc1": 75.0, "test_acc5": 92.0})
    assert events[2] == pytest.approx({"test_acc1": 76.13, "test_acc5": 92.862})  # the evaluation's summary


# -- pytorch/vision references/classification/utils.py (MetricLogger) and train.py -------------------------------


def test_torchvision_metric_logger() -> None:
    # log_msg = self.delimiter.join([header, "[{0" + space_fmt + "}/{1}]", "eta: {eta}", "{meters}",
    #                                "time: {time}", "data: {data}", "max mem: {memory:.0f}"]), delimiter "  ",
    # a meter: f"{name}: {str(meter)}", SmoothedValue fmt "{median:.4f} ({global_avg:.4f})"; lr and img/s "{value}"
    train = "  ".join(["Epoch: [0]", "[  10/5005]", "eta: 1 day, 2:03:04", "lr: 0.5", "img/s: 12.3",
                       "loss: 6.9088 (6.9088)", "acc1: 0.0000 (0.0000)", "acc5: 0.0000 (0.0000)", "time: 0.5000",
                       "data: 0.1000", "max mem: 4567"])
    test = "  ".join(["Test: ", "[  0/782]", "eta: 0:25:00", "loss: 0.5123 (0.5123)", "acc1: 87.5000 (87.5000)",
                      "time: 1.9000", "data: 1.8000", "max mem: 1234"])
    # evaluate: print(f"{header} Acc@1 {metric_logger.acc1.global_avg:.3f} Acc@5 {...acc5.global_avg:.3f}")
    summary = f"Test:  Acc@1 {76.13:.3f} Acc@5 {92.862:.3f}"
    events = read([train, test, summary])
    assert events[0] == pytest.approx({"epoch": 0, "step": 10, "lr": 0.5, "samples_s": 12.3, "loss": 6.9088,
                                       "acc1": 0.0, "acc5": 0.0, "steps_s": 2.0})
    assert events[1] == pytest.approx({"test_loss": 0.5123, "test_acc1": 87.5})
    assert events[2] == pytest.approx({"test_acc1": 76.13, "test_acc5": 92.862})


# -- huggingface/pytorch-image-models (timm) train.py ----------------------------------------------------------


def test_timm() -> None:
    # f'Train: {epoch} [{update_idx:>4d}/{updates_per_epoch} ({100. * (update_idx + 1) / updates_per_epoch:>3.0f}%)]  '
    # f'Loss: {loss_now:#.3g} ({loss_avg:#.3g})  Time: {t:.3f}s, {n / t:>7.2f}/s  ({ta:.3f}s, {n / ta:>7.2f}/s)  '
    # f'LR: {lr:.3e}  Data: {data_time_m.val:.3f} ({data_time_m.avg:.3f})'
    t, n = 0.5, 256
    train = (f'Train: {1} [{10:>4d}/{5004} ({100. * 11 / 5004:>3.0f}%)]  Loss: {6.93:#.3g} ({6.94:#.3g})  '
             f'Time: {t:.3f}s, {n / t:>7.2f}/s  ({t:.3f}s, {n / t:>7.2f}/s)  LR: {1e-05:.3e}  '
             f'Data: {0.1:.3f} ({0.1:.3f})')
    # validate: f'{log_name}: [{batch_idx:>4d}/{last_idx}]  Time: ...  Loss: {losses_m.val:>7.3f} ({...:>6.3f})  '
    #           f'Acc@1: {top1_m.val:>7.3f} ({top1_m.avg:>7.3f})  Acc@5: ...', log_name = 'Test' + log_suffix
    test = (f'Test: [{0:>4d}/{195}]  Time: {1.2:.3f} ({1.2:.3f})  Loss: {0.512:>7.3f} ({0.512:>6.3f})  '
            f'Acc@1: {87.5:>7.3f} ({87.5:>7.3f})  Acc@5: {97.0:>7.3f} ({97.0:>7.3f})')
    first = f'Train: {0} [{0:>4d}/{5004} (  0%)]  Loss: {6.95:#.3g} ({6.95:#.3g})  LR: {1e-05:.3e}'
    events = read([first, train, test])
    assert events[1] == pytest.approx({"epoch": 1, "step": 5004 + 10, "loss": 6.93, "lr": 1e-05, "samples_s": 512.0,
                                       "steps_s": 2.0})
    assert events[2] == pytest.approx({"test_loss": 0.512, "test_acc1": 87.5, "test_acc5": 97.0})


# -- facebookresearch/fairseq fairseq/logging/progress_bar.py (simple and json), fairseq_cli/train.py -----------

FAIRSEQ_PREFIX = "2021-03-01 12:00:00 | INFO | {} | "  # format="%(asctime)s | %(levelname)s | %(name)s | %(message)s"


def test_fairseq_simple() -> None:
    # SimpleProgressBar.log: logger.info("{}:  {:5d} / {:d} {}".format(self.prefix, self.i + 1, self.size, postfix)),
    # postfix ", ".join(key + "=" + stats[key].strip()); print: "{} | {}".format(self.prefix, " | ".join(key + " " + v))
    stats = {"loss": "10.237", "nll_loss": "10.1", "ppl": "1100.5", "wps": "12345.6", "ups": "3.21", "wpb": "3840",
             "bsz": "128", "num_updates": "100", "lr": "1.25e-05", "gnorm": "1.234", "train_wall": "31"}
    inner = FAIRSEQ_PREFIX.format("train_inner") + "{}:  {:5d} / {:d} {}".format(
        "epoch 001", 100, 1101, ", ".join(f"{k}={v}" for k, v in stats.items()))
    valid_stats = {"loss": "9.812", "ppl": "830.2", "num_updates": "1101"}
    valid = FAIRSEQ_PREFIX.format("valid") + "{} | {}".format(
        "epoch 001 | valid on 'valid' subset", " | ".join(f"{k} {v}" for k, v in valid_stats.items()))
    summary = FAIRSEQ_PREFIX.format("train") + "{} | {}".format("epoch 001", " | ".join(
        f"{k} {v}" for k, v in {**stats, "loss": "10.6", "num_updates": "1101"}.items()))
    events = read([inner, valid, summary])
    assert events[0] == pytest.approx({"epoch": 1, "step": 100, "loss": 10.237, "nll_loss": 10.1, "ppl": 1100.5,
                                       "tok_s": 12345.6, "steps_s": 3.21, "lr": 1.25e-05, "grad_norm": 1.234})
    assert events[1] == pytest.approx({"epoch": 1, "step": 1101, "val_loss": 9.812, "val_ppl": 830.2})
    assert events[2]["summary_loss"] == 10.6 and "loss" not in events[2]  # the epoch's mean


def test_fairseq_json() -> None:
    # JsonProgressBar.log: logger.info(json.dumps(stats)) with "epoch", "update" and format_stat(...) strings;
    # print: keys prefixed tag + "_" (valid_loss, valid_num_updates)
    inner = FAIRSEQ_PREFIX.format("train_inner") + ('{"epoch": 1, "update": 0.091, "loss": "10.237", "ppl": "1100.5", '
                                                    '"wps": "12345.6", "num_updates": "100", "lr": "1.25e-05"}')
    valid = FAIRSEQ_PREFIX.format("valid") + ('{"valid_epoch": 1, "valid_loss": "9.812", "valid_ppl": "830.2", '
                                              '"valid_num_updates": "1101"}')
    events = read([inner, valid])
    assert events[0] == pytest.approx({"epoch": 1, "step": 100, "loss": 10.237, "ppl": 1100.5, "tok_s": 12345.6,
                                       "lr": 1.25e-05})
    assert events[1] == pytest.approx({"epoch": 1, "step": 1101, "val_loss": 9.812, "val_ppl": 830.2})


# -- microsoft/DeepSpeed runtime/engine.py and utils/timer.py; DeepSpeedExamples training/cifar ------------------


def test_deepspeed() -> None:
    head = "[2023-06-01 10:00:00,123] [INFO] [{}] "  # "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:...]"
    # engine: log_dist(f"step={self.global_steps}, skipped={self.skipped_steps}, lr={lr}, mom={mom}") ([Rank 0] first)
    step = head.format("logging.py:96:log_dist") + \
        f"[Rank 0] step={10}, skipped={0}, lr={[0.0001]}, mom={[(0.9, 0.999)]}"
    # ThroughputTimer.stop: "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, "
    #                       "MemAllocated={}GB, MaxMemAllocated={}GB"
    rate = head.format("timer.py:260:stop") + "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, " \
        "CurrSamplesPerSec={}, MemAllocated={}GB, MaxMemAllocated={}GB".format(0, 10, 10, 25.123, 24.9, 1.5, 3.2)
    # cifar10_deepspeed.py: print(f"[{epoch + 1 : d}, {i + 1 : 5d}] loss: {running_loss / args.log_interval : .3f}")
    loss = f"[{0 + 1 : d}, {1999 + 1 : 5d}] loss: {2.235 : .3f}"
    events = read([step, rate, loss])
    assert events[0] == {"step": 10, "lr": 0.0001}
    assert events[1] == {"epoch": 0, "step": 10, "samples_s": 25.123}
    assert events[2] == {"loss": 2.235}


# -- karpathy/llm.c train_gpt2.cu ---------------------------------------------------------------------------------


def test_llm_c() -> None:
    # printf0("step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.0f tok/s\n", ...)
    line = "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.0f tok/s" % (
        10, 74, 5.012345, 0.12, 1.234, -0.5, 6e-4, 120.5, 34000.0)
    # printf0("val loss %f\n", val_loss);
    events = read([line, "val loss %f" % 3.456789])
    assert events[0] == pytest.approx({"step": 10, "total_steps": 74, "loss": 5.012345, "grad_norm": 1.234, "lr": 6e-4,
                                       "tok_s": 34000.0, "steps_s": 1000 / 120.5})
    assert events[1] == {"val_loss": 3.456789}


# -- keras-team/keras keras/src/utils/progbar.py and callbacks/progbar_logger.py ---------------------------------


def test_keras_progbar() -> None:
    # ProgbarLogger.on_epoch_begin: io_utils.print_msg(f"Epoch {epoch + 1}/{self.epochs}")
    # Progbar.update: bar = ("%" + str(numdigits) + "d/%d") % (current, self.target), bold; "━" bars in colour;
    # info: the time per unit (" 10ms/step"), then for each value f" - {k}:" + f" {avg:.4f}"
    def bar(current: int, values: dict) -> str:
        return (f"\x1b[1m{current:3d}/469\x1b[0m \x1b[32m{'━' * 20}\x1b[0m\x1b[37m\x1b[0m \x1b[1m5s\x1b[0m 10ms/step"
                + "".join(f" - {k}: {v:.4f}" for k, v in values.items()))
    events = [e for e in read(["Epoch 1/10", bar(469, {"accuracy": 0.94, "loss": 0.2, "val_accuracy": 0.97,
                                                       "val_loss": 0.1}),
                                "Epoch 2/10", bar(469, {"accuracy": 0.95, "loss": 0.15})]) if e]
    assert events[1] == pytest.approx({"step": 469, "total_steps": 4690, "acc": 0.94, "loss": 0.2, "val_acc": 0.97,
                                       "val_loss": 0.1, "steps_s": 100.0})
    assert events[3]["step"] == 938  # epoch 2's counter after the 469 steps of epoch 1


# -- Hugging Face transformers trainer_callback.py (ProgressCallback.on_log) and trainer_pt_utils.py -------------


def test_hugging_face_dicts_and_metric_sections() -> None:
    # on_log: self.training_bar.write(str(logs)); log_metrics: print(f"***** {split} metrics *****") and
    # print(f"  {key: <{k_width}} = {metrics_formatted[key]:>{v_width}}")
    events = read(["{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}",
                   "{'eval_loss': 2.5, 'eval_accuracy': 0.61, 'eval_runtime': 1.2, 'epoch': 0.5}",
                   "***** eval metrics *****", f"  {'epoch': <18} = {3.0:>8}", f"  {'eval_loss': <18} = {0.3456:>8}",
                   "***** train metrics *****", f"  {'train_loss': <18} = {0.5:>8}"])
    assert events[0] == {"loss": 2.31, "grad_norm": 1.2, "lr": 5e-05, "epoch": 0.5}
    assert events[1] == {"val_loss": 2.5, "val_acc": 0.61, "epoch": 0.5}
    assert events[4] == {"val_loss": 0.3456} and events[6] == {"summary_loss": 0.5}


# -- yunjey/pytorch-tutorial tutorials/01-basics/feedforward_neural_network/main.py ------------------------------


def test_pytorch_tutorial_epoch_and_step_of_totals() -> None:
    # print('Epoch [{}/{}], Step [{}/{}], Loss: {:.4f}'.format(epoch+1, num_epochs, i+1, total_step, loss.item()))
    form = 'Epoch [{}/{}], Step [{}/{}], Loss: {:.4f}'
    events = read([form.format(1, 5, 100, 600, 0.224), form.format(2, 5, 100, 600, 0.1)])
    assert events[0] == {"epoch": 1, "step": 100, "total_steps": 3000, "loss": 0.224}
    assert events[1]["step"] == 700


# -- facebookresearch/detectron2 detectron2/utils/events.py (CommonMetricPrinter) -------------------------------


def test_detectron2() -> None:
    # " {eta}iter: {iter}  {losses}  {non_losses}  {avg_time}{last_time}{avg_data_time}{last_data_time} lr: {lr}  "
    # "{memory}", eta "eta: {}  ", losses "  ".join(f"{k}: {v.median(window):.4g}"), "time: {:.4f}  ", "max_mem: {:.0f}M"
    losses = "  ".join(f"{k}: {v:.4g}" for k, v in {"total_loss": 2.345, "loss_cls": 1.2, "loss_box_reg": 0.5}.items())
    line = f" eta: 0:10:00  iter: {19}  {losses}    time: {0.5:.4f}  data_time: {0.0123:.4f}  lr: {0.00019981:.5g}  " \
        f"max_mem: {1234:.0f}M"
    assert read([line])[0] == pytest.approx({"step": 19, "loss": 2.345, "loss_cls": 1.2, "loss_box_reg": 0.5,
                                             "lr": 0.00019981, "steps_s": 2.0})


# -- open-mmlab/mmengine mmengine/runner/log_processor.py ---------------------------------------------------------


def test_mmengine() -> None:
    # f"Epoch({mode}) [{epoch}][{cur_iter}/{dataloader_len}]  " then f"{name}: {val:.4f}" items joined by "  "
    # ("lr: {:.4e}"), under the logger's "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
    head = "2023/01/01 00:00:00 - mmengine - INFO - "
    train = head + f"Epoch(train) [{1}][{50:>3}/{500}]  lr: {0.01:.4e}  eta: 0:10:00  time: {0.5:.4f}  " \
        f"data_time: {0.1:.4f}  memory: 1234  loss: {1.2345:.4f}  loss_cls: {0.5:.4f}"
    val = head + f"Epoch(val) [{1}][{500}/{500}]    accuracy/top1: {76.1:.4f}  accuracy/top5: {92.8:.4f}  " \
        f"data_time: {0.01:.4f}  time: {0.1:.4f}"
    events = read([train, val])
    assert events[0] == pytest.approx({"step": 50, "total_steps": 500, "lr": 0.01, "loss": 1.2345, "loss_cls": 0.5,
                                       "steps_s": 2.0})
    assert events[1] == pytest.approx({"val_acc1": 76.1, "val_acc5": 92.8})


# -- the shapes on their own ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "name"), [
    ("Loss", "loss"), ("train loss", "loss"), ("loss/train", "loss"), ("train_loss", "loss"), ("LR", "lr"),
    ("learning_rate", "lr"), ("valid loss", "val_loss"), ("eval_loss", "val_loss"), ("loss/val", "val_loss"),
    ("test_acc", "test_acc"), ("Acc@1", "acc1"), ("tokens/sec", "tok_s"), ("samples_per_second", "samples_s"),
    ("CurrSamplesPerSec", "samples_s"), ("it/s", "steps_s"), ("nll_loss", "nll_loss"), ("ppl", "ppl"),
])
def test_names_are_made_canonical(key: str, name: str) -> None:
    assert Parser().parse_line(f"{key}: 1.5") == {name: 1.5}


@pytest.mark.parametrize(("line", "expected"), [
    ("loss=2.5e-3 lr=1E-4", {"loss": 0.0025, "lr": 1e-4}),  # scientific notation
    ("step 7 | loss 1.5 | 12.3ms", {"step": 7, "loss": 1.5, "steps_s": 1000 / 12.3}),  # a time per step
    ("loss: 1.5 speed: 82.13/s", {"loss": 1.5, "samples_s": 82.13}),
    ("loss=1.5 throughput=3.2 tok/s", {"loss": 1.5, "tok_s": 3.2}),
    ("loss=1.5 2.5 s/it", {"loss": 1.5, "steps_s": 0.4}),
    ("loss 1.5\tms/batch 20", {"loss": 1.5, "steps_s": 50.0}),
])
def test_units_and_rates(line: str, expected: dict) -> None:
    assert Parser().parse_line(line) == pytest.approx(expected)


@pytest.mark.parametrize("line", [
    '  File "train.py", line 120, in <module>', "Downloading 3/10 files", "Using device: cpu",
    "Epoch 1 finished in 35 seconds at 12:03:04", "eta: 0:12:34", "max_epochs=2",
])
def test_lines_that_are_no_training_metric(line: str) -> None:
    event = Parser().parse_line(line)
    assert event is None or set(event) <= {"epoch"}


def test_a_tqdm_bar_redrawn_with_carriage_returns_into_a_file() -> None:
    # tqdm writes "\r" + the bar each update, with no newline, when stdout is a file as well
    line = "".join(f"\r{k * 5:3d}%|{'█' * k}{' ' * (20 - k)}| {k}/20 [00:0{k // 10}<00:01, 13.2it/s, "
                   f"loss={2 - k / 10:.2f}]" for k in range(1, 4))
    events = list(Parser().events(line))
    assert [e["step"] for e in events] == [1, 2, 3] and events[-1]["loss"] == 1.7 and events[-1]["steps_s"] == 13.2


def test_the_agent_reads_what_the_controller_reads() -> None:
    line = "| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 11.27 | loss  7.62 | ppl  2040.91"
    full = Parser().parse_line(line)
    assert metric_lines.parse(line) == {k: full[k] for k in ("step", "loss", "steps_s")}
    assert metric_lines.parse("Test set: Average loss: 0.0500, Accuracy: 9800/10000 (98%)") == {"test_loss": 0.05}


def test_a_readers_memory_carries_over_between_reads_of_one_log() -> None:
    first = Parser()
    first.parse_line("Epoch 1/10")
    again = Parser(state=first.state())  # the next refresh reads on from where this one stopped
    assert again.parse_line("469/469 [====] - 5s 10ms/step - loss: 0.2")["total_steps"] == 4690


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 10**6), st.floats(0, 1e4, allow_nan=False).map(lambda v: round(v, 4)),
                          st.floats(1e-9, 1e-3).map(lambda v: f"{v:.3e}")), min_size=6, max_size=6),
       st.sampled_from([
           "| epoch {} | {}/ {} batches | lr {} | ms/batch {} | loss {} |",
           "Train Epoch: {} [{}/{} ({}%)]\tLoss: {} acc: {}",
           "step {}/{} | loss {} (+{}z)| norm {} | lr {} | 12.3 ms | 4 tok/s",
           "Epoch: [{}]  [{}/{}]  lr: {}  loss: {} ({})",
           "epoch {}:  {} / {} loss={}, ppl={}, num_updates={}",
           "iter {} | step: {}/{} | train_loss: {} | Accuracy: {}/{}",
       ]))
def test_a_line_read_by_its_shapes_plan_reads_as_a_full_read(numbers: list, form: str) -> None:
    from orchestrator.agent.metrics import metric_shapes

    line = form.format(*numbers)
    metric_shapes.scan(line)  # its shape's plan is made (or it was made by an earlier example)
    planned, full = metric_shapes.scan(line), metric_shapes._scan(line, None)
    assert (planned.values, planned.times, planned.progress, planned.epoch_total, planned.step_total) == \
        (full.values, full.times, full.progress, full.epoch_total, full.step_total)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 10**6), st.floats(0, 1e4, allow_nan=False).map(lambda v: round(v, 4)),
                          st.floats(1e-9, 1e-3).map(lambda v: f"{v:.3e}"), st.integers(1000, 10**7).map("{:,}".format)),
                min_size=6, max_size=6),
       st.sampled_from([
           "| epoch {} | {}/ {} batches | lr {} | ms/batch {} | loss {} |",
           "Train Epoch: {} [{}/{} ({}%)]\tLoss: {} acc: {}",
           "step {}/{} | loss {} (+{}z)| norm {} | lr {} | 12.3 ms | 4 tok/s",
           "Epoch: [{}]  [{}/{}]  lr: {}  loss: {} ({})",
           "Test: [{}/{}] Acc@1 {} ({}) Acc@5 {} Loss {}",
           " * Acc@1 {} Acc@5 {} {} {} {} {}",
           "| end of epoch {} | time: {}s | valid loss {} | valid ppl {} {} {}",
           "iter {} | step: {}/{} | train_loss: {} | Accuracy: {}/{}",
           "step={} loss={} tok/s={} lr={} epoch={} time={}",
       ]))
def test_a_line_read_by_its_template_reads_as_a_full_read(numbers: list, form: str) -> None:
    # the fast path slices a line's numbers where its template's first line had them: it reads what a full read does
    line = form.format(*numbers)
    for before in ("", "test"):
        warm, fresh = metric_lines.Reader(), metric_lines.Reader()
        warm.last = fresh.last = before
        warm.read(line)  # its template is made (or was made by an earlier example)
        warm.last = before
        assert warm.read(line) == fresh._read(line, None)


def test_digits_in_a_name_are_not_numbers_of_the_template() -> None:
    # "top1" and "top5" share a template (digits made 0) but not a name: the second is read in full
    reader = metric_lines.Reader()
    assert reader.read("top1=0.5 loss=2.0") == {"acc1": 0.5, "loss": 2.0}
    assert reader.read("top5=0.7 loss=1.0") == {"acc5": 0.7, "loss": 1.0}
    assert reader.read("top1=0.25 loss=3.5") == {"acc1": 0.25, "loss": 3.5}


_MIXED_FORMS = [
    "step={} loss={} tok/s={} lr=3.0e-04 epoch={}",
    "[2026-11-29 09:32:22] step: {}/{} | loss: {} | grad_norm: 0.93 | Ktok/s: {}",
    '{{"step": {}, "loss": {}, "lr": 0.0003, "time": {}}}',
    '{{"acc{}": {}, "val_loss": {}, "tok/s": {}}}',
    "Epoch {}/{}",
    "Epoch [{}/{}], Step [{}/{}], Loss: {}",
    "top{}={} loss={}",
    "Test: [{}/{}] Acc@1 {} ({}) Acc@5 {} Loss {}",
    " * Acc@1 {} Acc@5 {}",
    "***** eval metrics *****",
    "  eval_loss = {}",
    "\x1b[31mstep: {}  \x1b[32mloss: {}\x1b[39m",
    "Epoch {}:  10%|█  | {}/20 [00:00<00:00, 266.20it/s, train_loss={}]"
    "\rEpoch 0:  15%|█  | 3/20 [00:01<00:00, 5it/s]",
    "iter {}: loss {}, time {}ms, mfu {}%",
    "tokens: {:,} loss: {}",
    "Saving checkpoint to checkpoints/ckpt-{}.npz",
    "validation started",
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_MIXED_FORMS) - 1),
                          st.lists(st.one_of(st.integers(0, 10**6), st.integers(1, 9),
                                             st.floats(0, 1e3, allow_nan=False).map(lambda v: round(v, 4))),
                                   min_size=6, max_size=6)),
                min_size=1, max_size=400),
       st.integers(1, 3000))
def test_a_chunk_read_at_once_reads_as_each_line_read_in_full(picks: list, repeat: int) -> None:
    # lines of one template are read together, a column at a time, in between lines that change what the reader
    # remembers (an epoch header, an evaluation section, the kind of the line before): the events, their order and
    # the order of their keys are those of reading each line in full, one after the other
    lines = []
    for i, (form, numbers) in enumerate(picks * (1 + repeat // len(picks))):
        lines.append(_MIXED_FORMS[form].format(*numbers) if form != 14 else
                     _MIXED_FORMS[form].format(int(numbers[0]) * 1000 + i, numbers[1]))
    fast, full = Parser().parse_lines(lines), Parser(fast=False).parse_lines(lines)
    assert [list(e.items()) for e in fast] == [list(e.items()) for e in full]


def test_a_chunks_columns_read_as_each_line_read_in_full() -> None:
    # a template's column of one number is found so from all its lines at once, a JSON line's values are cut where
    # its first line had them (a number with a leading 0 is no JSON: such lines are read in full), a whole number
    # is an int in the columns (Reader.tables) and a float in the events
    from orchestrator.agent.metrics.metric_lines import Reader

    lines = []
    for i in range(1, 5000):
        lines += [f"step={i} loss={1 / i:.5f} lr=3.0e-04 epoch=2 total=1000",
                  f'{{"step": {i}, "loss": {2 / i:.4f}, "lr": 0.0003, "n": 05}}',
                  f'{{"step": {i}, "loss": {2 / i:.4f}, "lr": 0.0003, "n": 15}}',
                  f'{{"step": 0{i % 10}, "val_loss": {1 / i:.4f}}}']
    fast, full = Parser().parse_lines(lines), Parser(fast=False).parse_lines(lines)
    assert [list(e.items()) for e in fast] == [list(e.items()) for e in full]
    tables = list(Reader().tables(lines))
    assert [e for t in tables for e in t.events()] == full
    steps = [column for t in tables for g in t.groups for name, column in zip(g.names, g.columns) if name == "step"]
    assert steps and all(type(v) is int for column in steps for v in column)
