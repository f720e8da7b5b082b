"""``python -m orchestrator.reach.keeper SOCKET IDLE_SECONDS``: run a keeper (started by the first orch command)."""

import sys

from .server import main

sys.exit(main(sys.argv[1:]))
