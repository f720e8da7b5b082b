"""When and where a run starts beside others: a project's queue of experiments (``runqueue``), which GPUs each
live run holds, so runs share a machine on disjoint GPUs (``gpu_share``), and a searching sweep conducted here
(``search``, its conductor ``search_loop``).
"""

# the modules the rest of the agent may import (tests/unit/test_layers.py)
__all__ = ["gpu_share", "runqueue", "search", "search_loop"]
