"""Bulk bytes over the OpenSSH client, with orch's trust decisions: what a big push runs its agent call on.

paramiko drives its encryption from Python, one call per packet (a channel carries ~190 MB/s on two cores);
OpenSSH's ``ssh`` with AES-GCM moves the same bytes at a third of the CPU. So a big stream goes through the
``ssh`` binary when it is on PATH, on the route the SSH transport resolved (hosts, ports, users, keys, jump
hosts), with a config file that orch writes for the call and passes with ``-F``::

    ssh -F <orch's config> orch-target -- 'python3 /root/.orch/agent/agent-<hash>.pyz'

``-F`` keeps ``~/.ssh/config`` and ``/etc/ssh/ssh_config`` out, and OpenSSH starts each jump host as
``ssh -F <the same file> -W ...``, so every hop is checked with ``StrictHostKeyChecking yes`` against orch's
known_hosts files only (never the system's; no key is ever recorded: ``UpdateHostKeys no``). A key OpenSSH
refuses is a ``HostKeyError``, never a reason to try the other way. ``plan`` returns None where the route
cannot be written as such a file (a ProxyCommand, a name with odd characters): the caller then sends the bytes
on its own connection. Nothing here is built as a shell string: ``ssh`` gets an argument list, and the remote
command comes quoted from ``ssh.remote_command``, the one place orch quotes for a remote shell.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from ...errors import HostKeyError, InputError, OrchError, TransportError, TransportTimeout
from .base import FileRange, Input, Result, TransportStats, pieces

#: AES-GCM first: on CPUs with AES instructions it costs a third of ChaCha20-Poly1305 (OpenSSH's default)
CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes256-ctr"
TARGET = "orch-target"
PIPE_SIZE = 1 << 20  # ssh's stdin: fewer wake-ups than the default 64 KiB
_NAME = re.compile(r"^[A-Za-z0-9._:\-]+$")  # a host or user name as it may stand unquoted in a config line
_USER = re.compile(r"^[A-Za-z0-9._\-]+$")


@dataclass(frozen=True)
class Hop:
    """One host on the way, as the SSH transport resolved it: the jump hosts first, the destination last."""

    host: str
    port: int
    user: str | None
    keys: tuple[str, ...] = ()  # key files to offer (absolute paths); the SSH agent's keys are offered too


@dataclass(frozen=True)
class Plan:
    """The config file's text and what errors call the destination."""

    config: str
    description: str


def binary() -> str | None:
    """The OpenSSH client on PATH, or None (then the bytes go over paramiko)."""
    return shutil.which("ssh")


def _path(value: str) -> str | None:
    """A file name as a config value: quoted, ``%`` escaped (OpenSSH expands tokens in these); None if it cannot be."""
    if '"' in value or any(ord(c) < 32 for c in value) or not os.path.isabs(value):
        return None
    return '"' + value.replace("%", "%%") + '"'


def plan(hops: list[Hop], known_hosts: list[str], *, connect_timeout: float, keepalive: int,
         attempts: int, description: str) -> Plan | None:
    """The ``-F`` file for reaching ``hops[-1]`` through ``hops[:-1]``, or None when a value cannot be written."""
    files = [_path(f) for f in known_hosts if os.path.isfile(f)]
    if not hops or None in files or not files:
        return None
    lines = []
    for index, hop in enumerate(hops):
        keys = [_path(k) for k in hop.keys]
        if not _NAME.match(hop.host) or (hop.user and not _USER.match(hop.user)) or None in keys:
            return None
        lines += [f"Host {TARGET if index == len(hops) - 1 else f'orch-hop-{index}'}",
                  f"  HostName {hop.host}", f"  Port {int(hop.port)}"]
        lines += [f"  User {hop.user}"] if hop.user else []
        lines += [f"  IdentityFile {k}" for k in keys]
        lines += [f"  ProxyJump orch-hop-{index - 1}"] if index else []
    lines += [
        "Host *",
        "  StrictHostKeyChecking yes",
        f"  UserKnownHostsFile {' '.join(f for f in files if f)}",
        "  GlobalKnownHostsFile /dev/null",
        "  UpdateHostKeys no",
        "  CheckHostIP no",
        "  VerifyHostKeyDNS no",
        "  CanonicalizeHostname no",
        "  BatchMode yes",
        "  PasswordAuthentication no",
        "  KbdInteractiveAuthentication no",
        f"  ConnectTimeout {max(1, int(connect_timeout + 0.999))}",
        f"  ConnectionAttempts {max(1, attempts)}",
        f"  ServerAliveInterval {max(0, keepalive)}",  # 0: off, as [ssh] keepalive = 0 is for paramiko
        "  ServerAliveCountMax 3",
        f"  Ciphers {CIPHERS}",
        "  Compression no",
        "  ControlMaster no",
        "  ControlPath none",
        "  ForwardAgent no",
        "  ForwardX11 no",
        "  ClearAllForwardings yes",
        "  PermitLocalCommand no",
        "  RequestTTY no",
        "  EscapeChar none",
        "  LogLevel ERROR",
        "",
    ]
    return Plan("\n".join(lines), description)


def run(ssh: str, route: Plan, argv: list[str], command: str, *, input: Input, stall: float | None,
        stats: TransportStats | None = None) -> Result:
    """Run ``argv``, quoted as ``command`` (``ssh.remote_command``), on the destination through ``ssh``, feeding
    ``input``; ``stall`` limits the time without a byte moving either way. A failure of ssh itself (exit 255 with
    no answer) is translated as the SSH transport's are; ``NotLoggedIn`` says that OpenSSH could not log in where
    paramiko may (another source of keys)."""
    folder = tempfile.mkdtemp(prefix="orch-ssh-")  # 0700, ours alone: removed when the call ends
    config = os.path.join(folder, "config")
    try:
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(route.config)
        out, err, code = _exchange([ssh, "-F", config, "-T", "-x", "-a", TARGET, "--", command], input, stall,
                                   argv[0], route.description, stats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if code == 255:
        _translate(err.decode("utf-8", "replace"), argv[0], route.description, sent=bool(out))
    return Result(list(argv), code, bytes(out), bytes(err))


class NotLoggedIn(TransportError):
    """OpenSSH was refused every key it offered: nothing ran, and the other way (paramiko) may still get in."""


_HOST_KEY = ("host key verification failed", "remote host identification has changed",
             "host key is known for", "no matching host key type")
_LOST = ("broken pipe", "connection closed", "connection reset", "closed by remote host", "timeout, server")


def _translate(err: str, what: str, where: str, *, sent: bool) -> None:
    """Exit 255 is ssh's own: raise what it means (a command that ran and exited 255 answered on stdout)."""
    if sent:
        return  # the command answered: its 255 is its own
    low = err.lower()
    lines = [line.strip() for line in err.splitlines() if line.strip() and not line.startswith("@")]
    said = lines[-1] if lines else "no message"
    if any(mark in low for mark in _HOST_KEY):
        why = next((line for line in lines if "host key" in line.lower() and "failed" not in line.lower()), said)
        raise HostKeyError(f"OpenSSH refused the host key of {where} (checked against orch's known_hosts): {why}",
                           hint="verify the host's key with its owner; connect once with --trust-new-host to "
                                "record a new host's key (a changed key is never accepted: remove the old line "
                                "only if the host was really reinstalled)")
    if "permission denied" in low or "too many authentication failures" in low:
        raise NotLoggedIn(f"OpenSSH could not log in to {where}: {said}", hint="")
    if "timed out" in low:
        raise TransportTimeout(f"no SSH answer from {where} within the connect timeout ({said})",
                               hint="the host may be down, frozen or filtered; check it and deploy again")
    if any(mark in low for mark in _LOST):
        raise TransportError(f"connection to {where} lost while {what} ran ({said}); the command may or may "
                             "not have run", hint="check the target's state before running it again")
    raise TransportError(f"ssh could not run {what} on {where}: {said}",
                         hint="check that the target is running and reachable, and its sshd")


def _exchange(command: list[str], data: Input, stall: float | None, what: str, where: str,
              stats: TransportStats | None) -> tuple[bytearray, bytearray, int]:
    """Feed stdin and drain stdout/stderr on threads; kill ssh when the stream fails or nothing moves for ``stall``."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # a Ctrl-C reaches orch, which hangs up: not ssh first
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        import fcntl

        fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # a smaller pipe only wakes ssh more often
    out, err = bytearray(), bytearray()
    moved = [time.monotonic()]
    failed: list[BaseException] = []

    def drain(stream, buf: bytearray) -> None:
        while chunk := stream.read1(1 << 16):
            buf.extend(chunk)
            moved[0] = time.monotonic()

    def feed() -> None:
        try:
            fd = proc.stdin.fileno()
            for piece in _raw(data):
                if isinstance(piece, FileRange):
                    sent = _splice(piece, fd, moved)
                else:
                    view = memoryview(piece)
                    while view:
                        done = os.write(fd, view)
                        view = view[done:]
                        moved[0] = time.monotonic()
                    sent = len(piece)
                if stats is not None:
                    stats.bytes_sent += sent
        except OrchError as exc:  # the stream itself failed (a local file vanished): stop the command
            failed.append(exc)
            proc.kill()
        except OSError:
            pass  # ssh went away: its exit code and stderr say why
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    threads = [threading.Thread(target=drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, err), daemon=True),
               threading.Thread(target=feed, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        while proc.poll() is None:
            if failed:
                break
            if stall is not None and time.monotonic() - moved[0] >= stall:
                proc.kill()
                raise TransportTimeout(
                    f"{what} made no progress for {stall:g} s on {where}",
                    hint="check the target's disk and the link; raise [ssh] command_timeout if it is just slow")
            try:
                proc.wait(0.25)
            except subprocess.TimeoutExpired:
                pass
    except BaseException:
        proc.kill()  # hang up: the command's side sees the controller go, as with a dropped connection
        raise
    finally:
        proc.wait()
        for thread in threads[:2]:
            thread.join(5)
    if failed:
        raise failed[0]
    return out, err, proc.returncode


def _raw(data: Input) -> Iterator[bytes | FileRange]:
    """``data``'s pieces with its file ranges left unread (``pieces`` reads them)."""
    if data is None or isinstance(data, (bytes, bytearray, memoryview)):
        yield from pieces(data)
    else:
        yield from data


def _splice(piece: FileRange, pipe: int, moved: list[float]) -> int:
    """Move a file range into the pipe without copying it through this process (read and written where splice
    cannot); a file that ends early, or cannot be read, is an ``InputError``. A closed pipe (ssh gone) raises
    ``BrokenPipeError``: ssh's exit says why."""
    splice = getattr(os, "splice", None)
    at, end = piece.offset, piece.offset + piece.length
    while at < end:
        try:
            done = splice(piece.fd, pipe, end - at, offset_src=at) if splice else -1
        except BrokenPipeError:
            raise
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EXDEV):
                raise InputError(f"cannot read {piece.name}: {exc.strerror}",
                                 hint="check the file and deploy again") from None
            splice, done = None, -1
        if done < 0:  # no splice for this file: through this process
            data = FileRange(piece.fd, at, end - at, piece.name).read()
            view = memoryview(data)
            while view:
                view = view[os.write(pipe, view):]
            done = len(data)
        if not done:
            raise piece.shrank()
        at += done
        moved[0] = time.monotonic()
    return piece.length
