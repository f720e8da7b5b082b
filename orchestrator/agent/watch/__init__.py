"""What a run's supervisor watches in its metrics, besides the run's own progress: its budget (``budget``), its guard
(``guard``: is the new run as good as the one it replaced?) and its webhooks (``notify``: crashes, stalls, spikes).

Each reads the run's log through the one metric reader (``agent.metrics.metric_lines``).
"""

# the modules the rest of the agent may import (tests/unit/test_layers.py)
__all__ = ["budget", "guard", "guard_state", "notify"]
