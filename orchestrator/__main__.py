"""``python -m orchestrator``: the ``orch`` command, run in this process (as ``python -m orchestrator.cli.main``)."""

import _signal

from .main import interrupted_while_starting

_signal.signal(_signal.SIGINT, interrupted_while_starting)  # before the CLI's imports, as the orch script does

from .cli.main import run_as_main  # noqa: E402

run_as_main()
