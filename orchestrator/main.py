"""The ``orch`` command: a command goes to this user's warm orch process when one listens, else runs here.

A warm process (``warm/server.py``) has orch's modules loaded already; for each command it forks a child that
takes this process's terminal (its stdin, stdout and stderr, passed over a Unix socket), working folder,
environment and umask, runs the command exactly as here, and sends back its exit code. Signals this process
gets (Ctrl-C, SIGTERM, SIGHUP) are passed on to that child; if this process is killed, the child kills itself.
So a repeat command skips the ~200 ms of imports. Interactive commands (``attach``, ``ssh``, ``forward``) and
shell completion always run here. When no warm process listens, the command runs here and, once it is done,
starts one for the next commands (``ORCH_WARM=0`` turns this off).
"""

import _signal  # the C module, loaded with Python: the handler below is in place before anything slower loads
import os
import sys

HERE_ONLY = {"attach", "ssh", "forward", "ui"}  # interactive, or serving until Ctrl-C
REACHING = {"deploy", "restart", "status", "stop", "logs", "pull"}  # commands that ask a target first of all


def interrupted_while_starting(_signum, _frame):
    """Ctrl-C while orch is still loading (before a command was handed on or run): nothing was done. The same as
    ``cli.main``'s, which this module must not import before the handler is in place."""
    os.write(2, b"interrupted: nothing was done\n")
    os._exit(130)


if os.path.basename(sys.argv[0]) == "orch":  # the entry script: its imports (the warm client's) come next
    _signal.signal(_signal.SIGINT, interrupted_while_starting)


def _eligible(argv: list[str]) -> bool:
    if os.environ.get("ORCH_WARM", "") == "0" or any(k.startswith(("_ORCH_COMPLETE", "_TYPER_COMPLETE"))
                                                       for k in os.environ):
        return False
    if any(a in ("--install-completion", "--show-completion") for a in argv):
        return False
    return not HERE_ONLY & set(argv)  # wherever the word is (after --config PATH, too): here is always right


def main() -> None:
    argv = sys.argv[1:]
    warm = _eligible(argv)
    if warm:
        from .warm import client as warm_client

        code = warm_client.run(argv)
        if code is not None:  # nothing of this process's own to tidy up: it ends without Python's finalization
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code & 0xFF)
    if REACHING & set(argv) and "--help" not in argv and "-h" not in argv:
        # the connection keeper, started before the CLI's imports: its own start goes on beside them
        from .reach.keeper.begin import prespawn

        prespawn(argv)  # told at once the connection these words reached the last time here, if it still holds
    from .cli.main import run_as_main

    # once this command is done: the warm process's start (~0.4 s of CPU) never slows it down; then the process
    # ends without Python's finalization, as ``python -m orchestrator`` does
    run_as_main(argv, warm_client.start_later if warm else None)


if __name__ == "__main__":  # ``python -m orchestrator.main``: what ``orch ui`` runs for its actions
    main()
