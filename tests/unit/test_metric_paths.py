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
