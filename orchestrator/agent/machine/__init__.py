"""What the target machine offers, checked before anything changes: its interpreter, tmux, disk and GPUs
(``system``), and the facts ``orch doctor`` judges (``doctor``).
"""

# the modules the rest of the agent may import (tests/unit/test_layers.py)
__all__ = ["doctor", "system"]
