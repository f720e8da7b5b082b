"""The agent's answers to the controller beyond one op's result: the resident agent on a held connection
(``serve``), the checks every request and op argument passes first (``validate``), and what streams back as frames
from an offset: a run's log (``logs``) and its files for ``orch pull`` (``run_files``).

The wire format itself (``agent.protocol``) and one call's op table (``agent.__main__``) sit in the agent's
package, beside the other helpers every room uses.
"""

# the modules the rest of the agent may import (tests/unit/test_layers.py)
__all__ = ["logs", "run_files", "serve", "validate"]
