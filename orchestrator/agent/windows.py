"""A run's tmux window beside live runs: a window of its own in the project's session that is there.

A project's runs share one session (``orch-<project>``), one window each (``exp<id>``). The session is
replaced (killed, made again) only when no live run is in it; a run started beside others, or resumed
after a reboot while another has resumed already, gets a window of its own instead.
"""

from __future__ import annotations


def beside(server, name: str, window: str, start_directory: str, command: str, environment: dict) -> bool:
    """Start ``command`` in a new window ``window`` of session ``name``; False when the session is not there
    (it ended meanwhile: its last run exited), so the caller makes a new one."""
    from libtmux.exc import LibTmuxException

    try:
        session = server.sessions.get(session_name=name, default=None)
        if session is None:
            return False
        session.new_window(window_name=window, attach=False, start_directory=start_directory,
                           window_shell=command, **({"environment": environment} if environment else {}))
    except LibTmuxException:
        if server.has_session(name):
            raise  # the session is there and refused the window: the caller records why
        return False
    return True
