"""The fast reader against the line-by-line reader: a chunk's lines read together (``Reader.tables``, templates,
shape plans) give the events of reading each line in full with no plan at all, for the values real logs print
(negative numbers, exponents, ``nan``/``inf``, words where a number was, thousands commas), the public excerpts'
line shapes mixed and repeated, a shape repeated with another kind of value, and a log read in several reads.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.metrics import metric_lines, metric_shapes
from orchestrator.watch.logparse import Parser


def _plain(lines: list[str]) -> list[dict]:
    """The events of reading each line in full, no shape's plan replayed (the reference the paths must give)."""
    real = metric_lines.scan
    metric_lines.scan = lambda text: metric_shapes._scan(text, None)
    try:
        return Parser(fast=False).parse_lines(lines)
    finally:
        metric_lines.scan = real


def _same(events: list[dict]) -> list[list]:
    """Events as comparable lists of items, in order (a nan equal to a nan)."""
    return [[(k, "nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in e.items()] for e in events]


def _paths(lines: list[str]) -> dict[str, list[list]]:
    """Each way orch reads ``lines``: at once (chunked), line by line (full), each line on its own (templates), as
    columns (the supervisor's), and in three reads carrying the reader's state."""
    one = metric_lines.Reader()
    third = len(lines) // 3
    pieces, state = [], None
    for part in (lines[:third], lines[third:2 * third], lines[2 * third:]):
        parser = Parser(state=state)
        pieces += parser.parse_lines(part)
        state = parser.state()
    return {"chunked": _same(Parser().parse_lines(lines)), "full": _same(Parser(fast=False).parse_lines(lines)),
            "each line": _same([e for line in lines for e in one.events(line)]),
            "columns": _same([e for t in metric_lines.Reader().tables(lines) for e in t.events()]),
            "three reads": _same(pieces)}


def _agree(lines: list[str]) -> None:
    want = _same(_plain(lines))
    for path, got in _paths(lines).items():
        assert got == want, path


# -- each difference a wider fuzz found, as a short excerpt ---------------------------------------------------------


def test_a_number_of_another_form_in_a_known_shape_reads_as_its_own_line() -> None:
    # "7e+02" and "7.28E+02" were one shape (a number that is not digits alone): the second line replayed the
    # first's plan (epoch 8.5), where read in full its "7e" is a total with a unit no epoch has
    _agree(["Epoch 3.9628/7.28E+02", "Epoch 8.5317/7e+02"])
    _agree(["Test set: Average loss: 5.28e+02, Accuracy: -6e+02/4.868E+02 (0.4675%)",
            "Test set: Average loss: 4.15e+02, Accuracy: -4.35e+02/1e+02 (7.6784%)"])
    _agree(["step 1/+inf | loss 0.5 | 339 ms", "step 8/INF | loss 0.4 | 577 ms"])


def test_a_nan_printed_as_a_spaced_value_is_read() -> None:
    # llm.c's printf0("val loss %f\n", val_loss) of a run that diverged: a nan is the loss, as "loss: nan" is
    assert Parser(fast=False).parse_line("val loss nan")["val_loss"] != 0.0
    assert math.isnan(Parser().parse_line("val loss NaN")["val_loss"])
    _agree(["val loss 0.0", "val loss NaN", "val loss -inf", "val loss 3.5"])


def test_a_line_that_holds_nothing_closes_a_metrics_section_in_a_chunk() -> None:
    # Hugging Face's "***** eval metrics *****" opens a section; a line that is none of its fields (here one with
    # no metric, read before) closes it, so the train_loss after it is the training's, not an evaluation's
    lines = ["validation started", "***** eval metrics *****", "  eval_loss          = 0.3", "validation started",
             "  train_loss         = 0.5171"]
    assert Parser().parse_lines(lines)[-1] == {"loss": 0.5171}
    _agree(lines)


def test_an_imagenet_summary_read_in_a_later_read_stays_the_evaluations() -> None:
    # pytorch/examples imagenet: " * Acc@1 ... Acc@5 ..." closes the evaluation the line before it printed; a status
    # that reads the log in two reads (or a supervisor started again) keeps which kind the last metric line was
    lines = ["Test: [190/196]\tTime  0.100 ( 0.200)\tLoss 1.0234e+00 (1.1000e+00)\tAcc@1  75.00 ( 76.00)",
             " * Acc@1 76.130 Acc@5 92.862"]
    first = Parser()
    first.parse_lines(lines[:1])
    assert Parser(state=first.state()).parse_lines(lines[1:]) == [{"test_acc1": 76.13, "test_acc5": 92.862}]
    _agree(lines)



def test_a_number_inside_a_name_is_the_names() -> None:
    # "top-0" and "top-1" share a template (digits made 0) and a shape, but "top-1" is acc1 and "top-0" no metric:
    # a line of either is read with the digits of its name
    assert Parser().parse_lines(["top-0=5", "top-1=5", "top-0=0 loss=0", "top-1=1 loss=1"]) == \
        [{"acc1": 5.0}, {"loss": 0.0}, {"acc1": 1.0, "loss": 1.0}]
    _agree(["top-0=5", "top-1=5", "top-0=0 loss=0", "top-1=1 loss=1", "top-0=2 loss=2"])

# -- the property: every path gives the reference's events ---------------------------------------------------------

# the shapes of the public excerpts (tests/unit/test_metric_shapes.py) and of the frameworks' formats, a {} per number
_FORMS = [
    "| epoch {} | {}/ {} batches | lr {} | ms/batch {} | loss {} | ppl {}",
    "| end of epoch {} | time: {}s | valid loss {} | valid ppl {}",
    "| End of training | test loss {} | test ppl {}",
    "Train Epoch: {} [{}/{} ({}%)]\tLoss: {}",
    "Test set: Average loss: {}, Accuracy: {}/{} ({}%)",
    "Epoch: [{}][{}/5005]\tTime {} ({})\tData {} ({})\tLoss {} ({})\tAcc@1 {} ({})\tAcc@5 {} ({})",
    "Test: [{}/196]\tTime {} ({})\tLoss {} ({})\tAcc@1 {} ({})\tAcc@5 {} ({})",
    " * Acc@1 {} Acc@5 {}",
    "Epoch: [{}]  [{}/5005]  eta: 1 day, 2:03:04  lr: {}  img/s: {}  loss: {} ({})  acc1: {} ({})  time: {}  data: {}",
    "Test:  Acc@1 {} Acc@5 {}",
    "Train: {} [{}/5004 ({}%)]  Loss: {} ({})  Time: {}s, {}/s  ({}s, {}/s)  LR: {}  Data: {} ({})",
    "2021-03-01 12:00:00 | INFO | train_inner | epoch 001:  {} / 1101 loss={}, nll_loss={}, ppl={}, wps={}, ups={}, "
    "num_updates={}, lr={}, gnorm={}",
    "2021-03-01 12:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {} | ppl {} | num_updates {}",
    '2021-03-01 12:00:00 | INFO | train_inner | {{"epoch": {}, "update": {}, "loss": "{}", "num_updates": "{}"}}',
    "[2023-06-01 10:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] step={}, skipped={}, lr=[{}], "
    "mom=[(0.9, 0.999)]",
    "[{}, {}] loss: {}",
    "step {}/{} | loss {} ({}z)| norm {} ({}z)| lr {} | {} ms | {} tok/s",
    "val loss {}",
    "Epoch {}/{}",
    "{}/469 ━━━━━━━━━━ 5s 10ms/step - accuracy: {} - loss: {} - val_accuracy: {} - val_loss: {}",
    "{{'loss': {}, 'grad_norm': {}, 'learning_rate': {}, 'epoch': {}}}",
    "{{'eval_loss': {}, 'eval_accuracy': {}, 'eval_runtime': {}, 'epoch': {}}}",
    "***** eval metrics *****",
    "***** train metrics *****",
    "  eval_loss          = {}",
    "  train_loss         = {}",
    "Epoch [{}/{}], Step [{}/{}], Loss: {}",
    " eta: 0:10:00  iter: {}  total_loss: {}  loss_cls: {}    time: {}  data_time: {}  lr: {}  max_mem: {}M",
    "2023/01/01 00:00:00 - mmengine - INFO - Epoch(val) [{}][{}/500]    accuracy/top1: {}  data_time: {}  time: {}",
    "iter {}: loss {}, time {}ms, mfu {}%",
    "step {}: train loss {}, val loss {}",
    "step: {}  loss: {}  grad_norm: {}  memory: 12.34GiB(15.60%)  tps: {}  tflops: {}  mfu: {}%",
    " [2025-08-01 07:19:50] iteration {}/ 1000000 | consumed samples: {} | elapsed time per iteration (ms): {} | "
    "learning rate: {} | lm loss: {} | grad norm: {} |",
    "Epoch {}:  10%|█  | {}/20 [00:00<00:00, {}it/s, train_loss={}]",
    "\x1b[31mstep: {}  \x1b[32mloss: {}\x1b[39m",
    "step={} loss={} tok/s={} lr={} epoch={}",
    "[2026-11-29 09:32:22] step: {}/{} | loss: {} | grad_norm: {} | Ktok/s: {}",
    '{{"step": {}, "loss": {}, "lr": {}, "time": {}}}',
    "top{}={} loss={}",
    "train loss {} | val loss {} | test acc {}",
    "Saving checkpoint to checkpoints/ckpt-{}.npz",
    "validation started",
    "",
]
_VALUE = st.one_of(
    st.integers(-10**4, 10**7).map(str),
    st.tuples(st.floats(-1e4, 1e4), st.integers(0, 6)).map(lambda p: f"{p[0]:.{p[1]}f}"),
    st.tuples(st.floats(-1e4, 1e4), st.integers(0, 4), st.sampled_from("eE")).map(lambda p: f"{p[0]:.{p[1]}{p[2]}}"),
    st.sampled_from(["nan", "-nan", "NaN", "inf", "-inf", "+inf", "Inf", "INF"]),
    st.sampled_from(["abc", "N/A", "None", "-", "--", "1e", "1.2.3", "x1"]),  # a word where a number was
    st.integers(1000, 10**8).map("{:,}".format),
    st.sampled_from(["+0.5", ".5", "5.", "0", "00", "007", "-0", "0.0", "1", "9"]),
)


def _turned(text: str, by: int) -> str:
    """``text`` with each digit moved on by ``by``: the same template (digits made 0), other numbers."""
    return text.translate(str.maketrans("0123456789", "".join(str((d + by) % 10) for d in range(10))))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, len(_FORMS) - 1), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 3), st.lists(_VALUE, min_size=12, max_size=12), st.booleans()),
                min_size=1, max_size=40),
       st.integers(1, 2200))
def test_every_path_reads_what_each_line_read_in_full_reads(forms: list, picks: list, lines_wanted: int) -> None:
    # a few shapes, each repeated with other numbers (its template read in batch) and with another kind of value (a
    # nan, a word, an exponent where it had digits: read in full), a bar's \r updates, past a chunk's end
    lines: list[str] = []
    while len(lines) < lines_wanted:
        for at, values, joined in picks:
            form = _FORMS[forms[at % len(forms)]]
            line = form.format(*[_turned(v, len(lines) // len(picks)) for v in values])
            lines.append(line + "\r" + _FORMS[forms[0]].format(*values) if joined and at == 3 else line)
    _agree(lines[:lines_wanted])
