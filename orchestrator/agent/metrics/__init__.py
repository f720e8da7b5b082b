"""The one metric reader, on the target and on the controller: a log line in, ``{metric: value}`` out
(``metric_lines``), over the per-framework formats, the general shapes and the names they are kept under. Pure.
"""

# the rest of the agent reads metrics through metric_lines alone (tests/unit/test_layers.py)
__all__ = ["metric_lines"]
