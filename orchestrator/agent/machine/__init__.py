"""Which machine the target is and what it offers: the CT a request expects, checked before any op (``identity``),
its interpreter, tmux, disk and GPUs, checked before anything changes (``system``), and the facts ``orch doctor``
judges (``doctor``).
"""

# the modules the rest of the agent may import (tests/unit/test_layers.py)
__all__ = ["doctor", "identity", "system"]
