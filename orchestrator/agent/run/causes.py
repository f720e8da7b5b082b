"""Why a run ended, as far as the target can tell: a hang-up from tmux, a container or machine restart.

    hangup_cause([signal.SIGHUP], run_dir)  # -> "the tmux server went away" (the supervisor got SIGHUP)
    lost_cause(pid_record)                  # -> "the container stopped" (a new boot id, or an init younger
                                            #    than the run), "the machine restarted", "its supervisor was killed"
    shutting_down()                         # -> True while the system goes down (its init's SIGTERM to every
                                            #    process is not an ``orch stop``, which leaves ``stop_requested``)
    shutdown_cause()                        # -> "interrupted by the container's shutdown"

    oom_cause(1234, "python3")              # -> "killed by the kernel's OOM killer" when the kernel log
                                            #    (/dev/kmsg, else dmesg; when readable) says it took pid 1234

A cause is a few words for ``status``; None when nothing is known.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from typing import Iterable

from .. import procstat

STOP_FILE = "stop_requested"


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _gone(pid: int, socket: str) -> bool:
    """Whether the tmux server ``pid`` has exited (a zombie nobody reaped yet counts) or its socket is gone."""
    if socket and not os.path.exists(socket):
        return True
    return procstat.exited(pid)


def hangup_cause(stopping: list, run_dir: str, tmux: str | None = None, wait: float = 1.0) -> str | None:
    """The supervisor got SIGHUP without a stop being asked: tmux took its pane away. Which way: the server
    (``$TMUX`` names its pid) exited, or only the session or pane was killed."""
    if signal.SIGHUP not in stopping or os.path.exists(os.path.join(run_dir, STOP_FILE)):
        return None
    parts = (tmux if tmux is not None else os.environ.get("TMUX", "")).split(",")
    server = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    if server is None:
        return "its terminal hung up"
    deadline = time.monotonic() + wait  # the server may still be exiting when its pane's process is told
    while not _gone(server, parts[0]):
        if time.monotonic() >= deadline:
            return "its tmux session was killed"
        time.sleep(0.02)
    return "the tmux server went away"


def in_container() -> bool:
    """Whether this is a container (LXC gives it a boot id of its own: a new one at each container start)."""
    try:
        with open("/run/systemd/container") as fh:
            if fh.read().strip():
                return True
    except OSError:
        pass
    try:
        with open("/proc/1/environ", "rb") as fh:
            return any(v.startswith(b"container=") for v in fh.read().split(b"\0"))
    except OSError:
        return False


def lost_cause(pid: dict) -> str:
    """A run whose supervisor vanished without recording an exit: what took it away."""
    then, now = pid.get("boot_id"), boot_id()
    init, supervisor = procstat.start(1), pid.get("supervisor_start")
    try:
        younger_init = init is not None and supervisor is not None and int(init) > int(supervisor)
    except (TypeError, ValueError):
        younger_init = False
    if (then and now and then != now) or younger_init:
        return "the container stopped" if in_container() else "the machine restarted"
    return "its supervisor was killed"


SHUTDOWN = ("interrupted by the container's shutdown", "interrupted by the machine's shutdown")
SYSTEMD_RUNNING = "/run/systemd/system"
FINAL_INIT = "systemd-shutdow"  # PID 1's name once systemd has handed over to systemd-shutdown (15 characters)


def shutting_down(init_comm: str = "/proc/1/comm", running: str = SYSTEMD_RUNNING) -> bool:
    """Whether the system (the container) is going down now. systemd first stops its units (a session's
    processes get SIGTERM from their scope; ``systemctl is-system-running`` says ``stopping``), then PID 1
    becomes ``systemd-shutdown``, which sends SIGTERM to every process left (those ``pct exec`` started).
    Both are read the same way in a privileged and an unprivileged container."""
    try:
        with open(init_comm) as fh:
            if fh.read().strip() == FINAL_INIT:
                return True
    except OSError:
        pass
    systemctl = shutil.which("systemctl")
    if not os.path.isdir(running) or systemctl is None:
        return False
    try:
        proc = subprocess.run([systemctl, "is-system-running"], capture_output=True, text=True, timeout=5,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.stdout.strip() == "stopping"


def shutdown_cause() -> str:
    return SHUTDOWN[0] if in_container() else SHUTDOWN[1]


OOM = "killed by the kernel's OOM killer"
# "Out of memory: Killed process 1234 (python3) …", "Memory cgroup out of memory: Killed process 1234 (…) …",
# and the summary line "oom-kill:constraint=…,task=python3,pid=1234,uid=0"
_OOM_LINES = (re.compile(r"out of memory: kill(?:ed)? process (\d+)(?: \((.*?)\))?", re.IGNORECASE),
              re.compile(r"\boom-kill:.*?(?:[:,]task=([^,]*))?[:,]pid=(\d+)\b"))
KMSG_MAX = 50000  # records read from /dev/kmsg at most: a kernel flooding its log must not keep the supervisor


def oom_killed(lines: Iterable[str]) -> dict[int, str | None]:
    """pid -> command name (None if the line has none) of what the kernel log says the OOM killer took
    (kmsg records, dmesg lines, with or without their prefixes)."""
    killed: dict[int, str | None] = {}
    for line in lines:
        match = _OOM_LINES[0].search(line)
        if match:
            killed[int(match.group(1))] = match.group(2) or killed.get(int(match.group(1)))
        match = _OOM_LINES[1].search(line)
        if match:
            killed[int(match.group(2))] = match.group(1) or killed.get(int(match.group(2)))
    return killed


def oom_cause(pid: int | None, comm: str | None = None, lines: Iterable[str] | None = None) -> str | None:
    """``OOM`` if the kernel log (``lines``, else read here) says the OOM killer took ``pid`` (and, when both
    are known, under the command name ``comm``: the kernel logs host pids, a container's supervisor sees its
    own, so a pid alone could name another process); else None."""
    if not pid:
        return None
    killed = oom_killed(kernel_log() if lines is None else lines)
    if int(pid) not in killed:
        return None
    logged = killed[int(pid)]
    return OOM if comm is None or logged is None or logged == comm[:15] else None


def comm(pid: int) -> str | None:
    """A process's command name as the kernel logs it (at most 15 characters)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _is_kmsg(path: str) -> bool:
    """/dev/kmsg itself (char device 1:11), not what a container put in its place (its console, say)."""
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 11)


def kernel_log(kmsg: str = "/dev/kmsg") -> list[str]:
    """The kernel's log as far as this process may read it: /dev/kmsg, else ``dmesg``; [] when neither is allowed."""
    if _is_kmsg(kmsg):
        try:
            fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            fd = -1
        if fd >= 0:
            lines = []
            try:
                for _ in range(KMSG_MAX):
                    try:
                        record = os.read(fd, 8192)
                    except BrokenPipeError:
                        continue  # records overwritten while reading: go on with the next one
                    except OSError:
                        break  # EAGAIN: the end of the log
                    if not record:
                        break
                    lines.append(record.decode("utf-8", "replace"))
            finally:
                os.close(fd)
            return lines
    try:
        proc = subprocess.run(["dmesg"], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return proc.stdout.decode("utf-8", "replace").splitlines() if proc.returncode == 0 else []
