"""A target's checkpoint folders: where each experiment's lives (``ckpt_layout``), cleaning into a trash and restoring
from it (``checkpoints``, with the trash on the folder's own filesystem: ``trash_location``), an older orch's nested
folders moved to their own place (``ckpt_move``), and which run wrote each checkpoint file (``ckpt_writers``).
"""

# the modules the rest of the agent may import; the others are this room's own (tests/unit/test_layers.py)
__all__ = ["checkpoints", "ckpt_layout", "ckpt_move", "ckpt_writers"]
