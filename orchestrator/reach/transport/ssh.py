"""The SSH target: one strictly host-key-checked connection per transport, reused for every call.

This module, its known_hosts policy (``hostkeys.py``) and the SSH config's reading (``sshconfig.py``) are
the only ones that use paramiko, loaded in functions through ``sshlib``, so that ``orch --help`` never pays for
them. Every paramiko/socket exception is translated here:

    unknown host key            -> HostKeyError (with the SHA256 fingerprint; --trust-new-host records it)
    changed host key            -> HostKeyError (always; names the known_hosts file and line)
    (both for every hop: each ProxyJump jump host is opened here, with the same strict policy)
    refused / unreachable       -> TransportError (retried with backoff, connecting only)
    no banner / no answer       -> TransportTimeout (within the connect timeout, not retried)
    bad key or user             -> TransportError
    connection lost mid-command -> TransportError (the command may or may not have run; never re-run)
"""

from __future__ import annotations

import logging
import os
import posixpath
import queue
import shlex
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from ...errors import HostKeyError, InputError, OrchError, TransportError, TransportTimeout
from .base import Input, Output, Result, Transport, pieces
from .hostkeys import KnownHosts, known_hosts_name
from . import sshconfig, sshlib
from .jumps import describe_jump, plan_route

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.config/orch/known_hosts")
DEFAULT_TRUST_FILE = "~/.config/orch/known_hosts"
DEFAULT_CONNECT_TIMEOUT = 10.0
_CHUNK = 1 << 20  # what one recv takes: whatever the channel holds, up to this
_QUEUED = 8  # stdout pieces waiting for a streamed command's ``output``: 8 MiB at most
_NULL_HANDLER = logging.NullHandler()


class SshTransport(Transport):
    """Runs commands on ``host`` over one SSH connection, opened on first use.

    ``connect_timeout=None`` takes ``ConnectTimeout`` from the SSH config, else 10 s. The same
    limit bounds the TCP connect, the server banner, the key exchange and authentication, so a
    host that accepts TCP but never answers fails in time. Jump hosts from ``ProxyJump`` are opened
    here too, each checked like the destination; ``role`` (e.g. "the Proxmox node pve1") names the
    destination in host-key errors.
    """

    streams = True

    def __init__(
        self,
        host: str,
        *,
        port: int | None = None,
        user: str | None = None,
        identity_file: str | None = None,
        ssh_config_file: str | None = None,
        known_hosts_files: list[str] | None = None,
        trust_file: str = DEFAULT_TRUST_FILE,
        trust_new_host: bool = False,
        connect_timeout: float | None = None,
        command_timeout: float | None = None,
        keepalive: int = 5,
        connect_retries: int = 2,
        backoff: float = 0.5,
        role: str | None = None,
    ) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self.user = user
        self.identity_file = identity_file
        self.ssh_config_file = ssh_config_file
        files = [os.path.expanduser(f) for f in (known_hosts_files or DEFAULT_KNOWN_HOSTS)]
        self.host_keys = KnownHosts(files, os.path.expanduser(trust_file), trust_new_host)
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.keepalive = keepalive
        self.connect_retries = connect_retries
        self.backoff = backoff
        self.role = role
        self.description = f"{user + '@' if user else ''}{host}{':' + str(port) if port else ''}"
        self._timeout = connect_timeout if connect_timeout is not None else DEFAULT_CONNECT_TIMEOUT
        self._conn: Any = None
        self._legs: list[_Leg] = []
        self._sftp: Any = None
        self._lock = threading.Lock()
        # one SFTP session serves every put, and paramiko's SFTPClient takes one caller at a time: two threads'
        # pipelined writes interleave their requests and read each other's replies (the keeper's threads did)
        self._put_lock = threading.Lock()

    def retarget(self, host: str) -> None:
        self.close()
        self.host = host
        user, port = self.user, self.port
        self.description = f"{user + '@' if user else ''}{host}{':' + str(port) if port else ''}"

    # -- connecting -------------------------------------------------------------------------------

    def _connection(self) -> Any:
        """The open connection to the destination, opening every hop (with retries) on first use."""
        with self._lock:
            if self._conn is not None and self._conn.transport is not None and self._conn.transport.is_active():
                return self._conn
            if self._conn is not None:
                self._drop()
            attempt = 0
            while True:
                legs = self._new_route()
                try:
                    for index, leg in enumerate(legs):
                        self._open(leg, self._channel(legs[index - 1], leg) if index else None)
                    break
                except _Retryable as exc:
                    _close(legs)
                    if attempt >= self.connect_retries:
                        raise exc.error from exc.__cause__
                    time.sleep(self.backoff * (2 ** attempt))
                    attempt += 1
                except BaseException:
                    _close(legs)
                    raise
            self._legs = legs
            self._conn = conn = legs[-1].conn
            self.stats.connections += 1
            if self.keepalive:
                for leg in legs:
                    leg.conn.transport.set_keepalive(self.keepalive)
            return conn

    def _new_route(self) -> list[_Leg]:
        """One unopened Connection per hop, first hop first: the jump hosts of ``ProxyJump``, then the
        destination. Every hop gets the same strict host-key policy, timeouts and key."""
        # paramiko logs every failed handshake with a traceback; our errors already say it all.
        logging.getLogger("paramiko").addHandler(_NULL_HANDLER)

        settings = sshconfig.lookup(sshconfig.load(self.ssh_config_file))
        host, user, port = sshconfig.split_host(self.host, self.user, self.port)
        route = plan_route(host, settings)
        dest = sshconfig.Connection(host, settings, user=user, port=port)
        self._timeout = self.connect_timeout if self.connect_timeout is not None else \
            float(dest.connect_timeout or DEFAULT_CONNECT_TIMEOUT)
        legs = []
        for hop in route.hops:
            conn = sshconfig.Connection(hop.alias, settings, user=hop.user, port=hop.port)
            legs.append(self._prepare(conn, describe_jump(hop.alias, conn.host, conn.port)))
        legs.append(self._prepare(dest, f"{self.role} ({dest.host}:{dest.port})" if self.role else None))
        legs[0].proxy_command = route.proxy_command
        self.description = f"{dest.user}@{dest.host}:{dest.port}"
        return legs

    def _prepare(self, conn: sshconfig.Connection, label: str | None) -> _Leg:
        kwargs = dict(conn.connect_kwargs)
        if self.identity_file:
            kwargs["key_filename"] = [os.path.expanduser(self.identity_file), *(kwargs.get("key_filename") or [])]
        timeout = self._timeout
        kwargs.update(timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                      transport_factory=_aead_first)
        conn.connect_kwargs = kwargs
        self.host_keys.install(conn.client, label)
        return _Leg(conn, label)

    def _channel(self, via: _Leg, leg: _Leg) -> Any:
        """A direct-tcpip channel from the previous hop to this one's address (what ``ssh -W`` does)."""
        paramiko = sshlib.paramiko()

        conn, where = leg.conn, f"{leg.conn.host}:{leg.conn.port}"
        try:
            return via.conn.transport.open_channel("direct-tcpip", dest_addr=(conn.host, int(conn.port)),
                                                   src_addr=("", 0), timeout=self._timeout)
        except paramiko.ChannelException as exc:
            error = TransportError(f"{via.label} cannot reach {where}: {exc.text}",
                                   hint="check that the host is up, that the jump host can reach it, and that "
                                        "the jump host allows TCP forwarding (AllowTcpForwarding)")
            if exc.code == 1:  # administratively prohibited: retrying cannot help
                raise error from exc
            raise _Retryable(error) from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _Retryable(TransportError(f"{via.label} did not open a channel to {where}: {exc}",
                                            hint="check the jump host and retry")) from exc

    def _open(self, leg: _Leg, sock: Any = None) -> None:
        """One connect attempt, through ``sock`` (a channel from the previous hop), a ProxyCommand, or TCP.

        A ProxyCommand is an external program: orch checks the key of the host it leads to, and the
        command checks whatever it passes through (``ssh -W`` does, with OpenSSH's own known_hosts).
        """
        proxy = None
        if sock is None and leg.proxy_command:
            sock = proxy = _start_proxy_command(leg.proxy_command, self._timeout)
        try:
            self._handshake(leg, sock)
        except (TransportError, _Retryable) as exc:
            code = None if proxy is None or isinstance(exc, HostKeyError) else _exit_code(proxy.process)
            if proxy is not None:
                proxy.close()
            if code is None:  # the command still ran: the failure is the far side's, already translated
                raise
            tail = proxy.process.stderr.read().decode("utf-8", "replace").strip().splitlines()[-1:]
            raise TransportError(
                f"the ProxyCommand for {leg.label or leg.conn.host} exited with code {code}"
                + (f": {tail[0]}" if tail else ""),
                hint="run the command by hand to see why; with ssh -W, OpenSSH checks the jump host's key "
                     "itself (UserKnownHostsFile, StrictHostKeyChecking); ProxyJump lets orch check it") from exc

    def _handshake(self, leg: _Leg, sock: Any) -> None:
        """One SSH handshake, with every failure translated; retryable ones wrapped in _Retryable."""
        paramiko = sshlib.paramiko()
        from paramiko.ssh_exception import NoValidConnectionsError

        conn = leg.conn
        where = leg.label or f"{conn.host}:{conn.port}"
        begin = time.monotonic()
        try:
            conn.connect_kwargs["sock"] = sock if sock is not None else self._socket(conn.host, conn.port)
            conn.open()
        except paramiko.BadHostKeyException as exc:
            raise self.host_keys.changed(known_hosts_name(conn.host, conn.port), exc.key, leg.label) from exc
        except paramiko.AuthenticationException as exc:
            if "transport shut down or saw EOF" in str(exc):  # the connection dropped mid-login: no refusal
                raise _Retryable(TransportError(f"{where} closed the connection while orch logged in",
                                                hint="check the network and the target's sshd (MaxStartups, "
                                                     "logs)")) from exc
            raise self._auth_failed(leg, where, f"refused every key offered ({exc})") from exc
        except NoValidConnectionsError as exc:
            raise _Retryable(TransportError(
                f"cannot connect to {where}: connection refused or host unreachable",
                hint="check that the target is running and that sshd listens on that port"
                     + ("" if self._node(leg) else _PCT))) from exc
        except socket.timeout as exc:
            raise self._timed_out(where, "no TCP connection") from exc
        except socket.gaierror as exc:
            raise TransportError(f"cannot resolve host name {conn.host!r}: {exc.strerror}",
                                 hint="set [proxmox] node_ssh.host to the node's address (its name does not "
                                      "resolve here)" if self._node(leg) else
                                 "check the name or use an IP address") from exc
        except OSError as exc:
            if exc.filename and os.path.abspath(exc.filename) in _key_files(conn):
                raise self._auth_failed(leg, where, f"could not be offered the key {exc.filename}: "
                                                    f"{exc.strerror or exc}") from exc
            raise _Retryable(TransportError(f"cannot connect to {where}: {exc.strerror or exc}",
                                            hint="check that the target is running, reachable, and that "
                                                 "sshd listens on that port")) from exc
        except paramiko.SSHException as exc:
            # paramiko reports a banner/kex timeout in several ways (sometimes only as "No existing
            # session" when its thread loses the race), so the time spent is the reliable signal.
            if "no authentication methods available" in str(exc).lower():  # no agent, no key file at all
                raise self._auth_failed(leg, where, "cannot be logged in to: orch has no key to offer") from exc
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, TimeoutError) or time.monotonic() - begin >= 0.9 * self._timeout:
                raise self._timed_out(where, "no SSH answer") from exc
            raise _Retryable(TransportError(f"SSH handshake with {where} failed: {exc}",
                                            hint="check that an SSH server listens on that port")) from exc
        except EOFError as exc:
            raise _Retryable(TransportError(f"{where} closed the connection during the SSH handshake",
                                            hint="check the target's sshd (MaxStartups, logs)")) from exc

    def _socket(self, host: str, port: int) -> socket.socket:
        """The TCP connection, with Nagle off: SSH requests are small and sent back to back, and
        with Nagle each round trip waits ~40 ms for a delayed ACK."""
        sock = socket.create_connection((host, port), timeout=self._timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _auth_failed(self, leg: "_Leg", where: str, what: str) -> TransportError:
        """The host would not let us in: which keys were tried, where the key is set, where it must be known."""
        conn = leg.conn
        who = f"{conn.user}@{where}" if leg.label is None else f"{where} (user {conn.user})"
        tried = [*_key_files(conn), *(f for f in _DEFAULT_KEYS if os.path.isfile(os.path.expanduser(f)))]
        agent = "the SSH agent's keys" if os.environ.get("SSH_AUTH_SOCK") else "no SSH agent (SSH_AUTH_SOCK unset)"
        keys = ", ".join(dict.fromkeys(tried)) or f"none ([ssh] identity_file unset, no {', '.join(_DEFAULT_KEYS)})"
        node = self._node(leg)
        where_key = "the Proxmox node's ~/.ssh/authorized_keys (root's for node_ssh.user = \"root\")" if node \
            else "the target's ~/.ssh/authorized_keys"
        user = "[proxmox] node_ssh.user" if node else \
            'User in ~/.ssh/config, or user = "..." in the target\'s section of orch.toml'
        return TransportError(
            f"{who} {what} (tried: {agent}; key files: {keys})",
            hint=f"set [ssh] identity_file in orch.toml to your private key (or IdentityFile in ~/.ssh/config, "
                 f"or add it to ssh-agent), put its public key in {where_key}, and check the user ({user})"
                 + ("" if node else _PCT))

    def _node(self, leg: "_Leg") -> bool:
        """Whether this hop is the Proxmox node of an ``access = "pct"`` target (set by [proxmox] node_ssh)."""
        return leg.label is not None and (self.role or "").startswith("the Proxmox node") and \
            leg.label.startswith(self.role or "")

    def _timed_out(self, where: str, what: str) -> TransportTimeout:
        return TransportTimeout(
            f"{what} from {where} within {self._timeout:g} s",
            hint="the host may be down, frozen or filtered; check it, or raise ConnectTimeout / "
                 "[ssh] connect_timeout if it is just slow")

    def _drop(self) -> None:
        legs, self._legs, self._conn, self._sftp = self._legs, [], None, None
        _close(legs)

    # -- running ----------------------------------------------------------------------------------

    def run(self, argv: list[str], *, input: Input = None, timeout: float | None = None,
            stall: float | None = None, output: Output = None, cancel: threading.Event | None = None) -> Result:
        """As ``Transport.run``; setting ``cancel`` hangs up the command's channel (the keeper does, when the
        orch command it runs for goes away)."""
        if not argv:
            raise InputError("empty command", hint="pass the program and its arguments as a list")
        limit = timeout if timeout is not None else (self.command_timeout if stall is None else None)
        chan = self.open_channel(argv)
        self.stats.commands += 1
        try:
            out, err, code = self._exchange(chan, input, limit, stall, argv, output, cancel)
        except BaseException:
            chan.close()  # hang up: the command's side sees the controller go, as with a dropped connection
            raise
        self.stats.bytes_received += len(out) + len(err)
        return Result(list(argv), code, bytes(out), bytes(err))

    def run_bulk(self, argv: list[str], *, open: Callable[[], Input], stall: float | None = None) -> Result:
        """As ``Transport.run_bulk``: through the OpenSSH client when it is on PATH (``openssh.py``: a third of
        paramiko's CPU per byte), on this transport's route and known_hosts files; on this connection when it is
        not, when the route cannot be handed to it (a ProxyCommand), or when OpenSSH is refused every key."""
        from . import openssh

        ssh = openssh.binary()
        if ssh and self.host_keys.trust_new_host:
            self._connection()  # a new host's key is recorded by orch's policy, never by OpenSSH
        route = self._openssh_plan() if ssh else None
        if ssh and route is not None:
            try:
                result = openssh.run(ssh, route, argv, remote_command(argv), input=open(), stall=stall,
                                     stats=self.stats)
            except openssh.NotLoggedIn:
                pass  # paramiko may offer a key OpenSSH does not (look_for_keys); nothing ran there
            else:
                self.stats.commands += 1
                self.stats.extra["bulk"] = "openssh"
                self.stats.bytes_received += len(result.stdout) + len(result.stderr)
                return result
        self.stats.extra["bulk"] = "paramiko"
        return self.run(argv, input=open(), stall=stall)

    def _openssh_plan(self) -> Any:
        """This transport's route as OpenSSH's ``-F`` file (``openssh.plan``), or None where it cannot be one."""
        from . import openssh

        legs = self._new_route()
        if legs[0].proxy_command:
            return None
        hops = [openssh.Hop(str(leg.conn.host), int(leg.conn.port), leg.conn.user, tuple(_key_files(leg.conn)))
                for leg in legs]
        return openssh.plan(hops, self.host_keys.files, connect_timeout=self._timeout, keepalive=self.keepalive,
                            attempts=self.connect_retries + 1, description=self.description)

    def _exchange(self, chan: Any, data: Input, limit: float | None, stall: float | None,
                  argv: list[str], output: Output = None,
                  cancel: threading.Event | None = None) -> tuple[bytearray, bytearray, int]:
        """Feed stdin and drain stdout/stderr concurrently so neither side can block the other.

        While the command is silent, keepalive requests probe the server (like OpenSSH's
        ServerAliveInterval with ServerAliveCountMax=3), so a peer that vanished without closing
        the TCP connection is noticed instead of waited on forever. ``stall`` limits the time
        without a byte moving either way (a keepalive answer is not progress).
        """
        out, err = bytearray(), bytearray()
        # bounded: a reader slower than the link (a pull writing and hashing) holds the channel's window shut,
        # so the far side waits instead of this process buffering what it cannot take yet
        arrived: queue.Queue | None = queue.Queue(maxsize=_QUEUED) if output is not None else None
        heard = [time.monotonic()]
        progressed = [heard[0]]
        failed: list[BaseException] = []
        transport = chan.get_transport()

        def drain(recv: Any, buf: bytearray) -> None:
            try:
                while chunk := recv(_CHUNK):
                    if arrived is not None and buf is out:
                        while True:  # handed to ``output`` on the calling thread
                            try:
                                arrived.put(chunk, timeout=0.25)
                                break
                            except queue.Full:
                                if chan.closed:
                                    return
                                heard[0] = progressed[0] = time.monotonic()  # the link delivers: we are slow
                    else:
                        buf.extend(chunk)
                    heard[0] = progressed[0] = time.monotonic()
            except Exception:
                return

        def deliver(wait: float) -> None:
            """Hand what stdout brought to ``output``, waiting up to ``wait`` s for the first piece."""
            assert arrived is not None and output is not None
            try:
                chunk = arrived.get(timeout=wait) if wait > 0 else arrived.get_nowait()
                while True:
                    self.stats.bytes_received += len(chunk)
                    output(chunk)
                    chunk = arrived.get_nowait()
            except queue.Empty:
                return

        def feed() -> None:
            try:
                for piece in pieces(data):
                    chan.sendall(piece)
                    self.stats.bytes_sent += len(piece)
                    heard[0] = progressed[0] = time.monotonic()
                chan.shutdown_write()
            except OrchError as exc:  # the stream itself failed (a local file vanished): stop the command
                failed.append(exc)  # first: the close below ends the wait, which must then find the failure
                try:
                    chan.close()  # the command stops; the caller may have closed the whole connection already
                except Exception:  # noqa: BLE001 (then the connection's end stops it)
                    pass
            except Exception:
                return

        def probe() -> None:
            transport.global_request("keepalive@openssh.com", wait=True)
            if transport.is_active():
                heard[0] = time.monotonic()

        readers = [threading.Thread(target=drain, args=(chan.recv, out), daemon=True),
                   threading.Thread(target=drain, args=(chan.recv_stderr, err), daemon=True)]
        for thread in [*readers, threading.Thread(target=feed, daemon=True)]:
            thread.start()
        deadline = None if limit is None else time.monotonic() + limit
        prober: threading.Thread | None = None
        while not (chan.status_event.is_set() and not any(t.is_alive() for t in readers)):
            now = time.monotonic()
            if failed:
                raise failed[0]
            if cancel is not None and cancel.is_set():
                raise TransportError(f"{argv[0]} on {self.description} was abandoned by the orch command that ran it",
                                     hint="")
            if deadline is not None and now >= deadline:
                chan.close()
                raise TransportTimeout(
                    f"{argv[0]} did not finish within {limit:g} s on {self.description}",
                    hint="it may still be running there; raise the timeout if the target is just slow")
            if stall is not None and now - progressed[0] >= stall:
                chan.close()
                raise TransportTimeout(
                    f"{argv[0]} made no progress for {stall:g} s on {self.description}",
                    hint="check the target's disk and the link; raise [ssh] command_timeout if it is just slow")
            silent = now - heard[0]
            if self.keepalive and silent > 4 * self.keepalive:
                self._drop()
                raise TransportError(
                    f"connection to {self.description} lost while {argv[0]} ran (no answer to keepalives "
                    f"for {silent:.0f} s); the command may or may not have run",
                    hint="check the target's state before running it again")
            if self.keepalive and silent > self.keepalive and (prober is None or not prober.is_alive()):
                prober = threading.Thread(target=probe, daemon=True)
                prober.start()
            wait = 0.25 if deadline is None else max(0.0, min(0.25, deadline - now))
            if arrived is not None and not chan.status_event.is_set():
                deliver(wait)  # wakes as soon as a piece arrives
            elif chan.status_event.is_set():
                for thread in readers:
                    thread.join(wait)
            else:
                chan.status_event.wait(wait)
        if failed:
            raise failed[0]
        if arrived is not None:
            deliver(0)
        code = chan.recv_exit_status()
        alive = transport is not None and transport.is_active()
        chan.close()
        if code == -1 and not alive:
            self._drop()
            raise TransportError(
                f"connection to {self.description} lost while {argv[0]} ran; the command may or may not have run",
                hint="check the target's state before running it again")
        return out, err, code

    # -- the connection, and channels left to the caller -------------------------------------------------

    def connect(self) -> None:
        self._connection()

    def alive(self) -> bool:
        conn = self._conn
        return conn is not None and conn.transport is not None and conn.transport.is_active()

    def local_port(self) -> int | None:
        """None through a jump host or a ProxyCommand (no TCP socket of ours leads to the destination)."""
        try:
            return int(self._conn.transport.sock.getsockname()[1])
        except (AttributeError, OSError, TypeError, IndexError):
            return None

    @property
    def answer_timeout(self) -> float:
        """``connect_timeout``, else ``ConnectTimeout`` from the SSH config, else 10 s."""
        return float(self._timeout)

    def open_channel(self, argv: list[str] | None, *, pty: tuple[str, int, int] | None = None) -> Any:
        """A session channel running ``argv`` (quoted here, and only here). Without ``pty``, a connection found
        dead before the command started is dropped and ``NotStartedError`` raised: it never ran."""
        conn = self._connection()
        what = argv[0] if argv else "the shell"
        try:
            chan = conn.transport.open_session(timeout=self._timeout)
            if pty is None:
                chan.exec_command(remote_command(argv or []))
        except Exception as exc:
            self._drop()
            raise NotStartedError(f"connection to {self.description} lost before {what} started: {exc}",
                                  hint="check the target and rerun") from exc
        if pty is None:
            return chan
        term, cols, rows = pty
        try:
            chan.get_pty(term=term, width=cols, height=rows)
            if argv:
                chan.exec_command(remote_command(argv))
            else:
                chan.invoke_shell()
        except Exception as exc:
            chan.close()
            raise TransportError(f"{self.description} refused a terminal: {exc}",
                                 hint="check the target's sshd (PermitTTY) and retry") from exc
        return chan

    def open_tunnel(self, host: str, port: int, origin: tuple[str, int]) -> Any:
        """A direct-tcpip channel; ``TransportError`` with the far side's reason when it is refused."""
        conn = self._connection()
        try:
            return conn.transport.open_channel("direct-tcpip", dest_addr=(host, port), src_addr=origin, timeout=10)
        except Exception as exc:  # ChannelException (refused there), SSHException, EOFError
            raise TransportError(getattr(exc, "text", None) or str(exc) or type(exc).__name__,
                                 hint="is the server up and listening there?") from exc

    # -- files ------------------------------------------------------------------------------------

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write through SFTP on the same connection: mkdir -p, temp file beside, chmod, posix-rename."""
        with self._put_lock:
            self._put(data, path, mode)
        self.stats.bytes_sent += len(data)

    def _put(self, data: bytes, path: str, mode: int) -> None:
        paramiko = sshlib.paramiko()
        conn = self._connection()
        parent = posixpath.dirname(path) or "."
        tmp = posixpath.join(parent, f".orch-put-{uuid.uuid4().hex[:12]}")
        try:
            sftp = self._sftp_client(conn)
            self._makedirs(sftp, parent)
            with sftp.open(tmp, "wb") as fh:
                fh.set_pipelined(True)
                fh.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if isinstance(exc, TimeoutError) or conn.transport is None or not conn.transport.is_active():
                self._drop()
                raise TransportError(f"connection to {self.description} lost while writing {path}",
                                     hint="check the target and rerun; the file was not replaced") from exc
            self._discard(tmp)
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise TransportError(f"cannot write {path} on {self.description}: {reason}",
                                 hint="check the permissions and free space on the target") from exc

    def _sftp_client(self, conn: Any) -> Any:
        if self._sftp is None:
            self._sftp = conn.client.open_sftp()
            self._sftp.get_channel().settimeout(self._timeout * 3)
        return self._sftp

    @staticmethod
    def _makedirs(sftp: Any, folder: str) -> None:
        missing = []
        while folder not in ("", "/", "."):
            try:
                sftp.stat(folder)
                break
            except FileNotFoundError:
                missing.append(folder)
                folder = posixpath.dirname(folder)
        for item in reversed(missing):
            try:
                sftp.mkdir(item)
            except OSError:
                sftp.stat(item)

    def _discard(self, tmp: str) -> None:
        try:
            if self._sftp is not None:
                self._sftp.remove(tmp)
        except Exception:
            return

    def close(self) -> None:
        with self._lock:
            self._drop()


def remote_command(argv: list[str]) -> str:
    """``argv`` as the one string an SSH server hands to the user's shell: the only place orch quotes for one."""
    return shlex.join(argv)


_DEFAULT_KEYS = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")  # what paramiko looks for


def _key_files(conn: Any) -> list[str]:
    """The key files given for this hop ([ssh] identity_file, IdentityFile), as absolute paths."""
    files = conn.connect_kwargs.get("key_filename") or []
    return [os.path.abspath(os.path.expanduser(f)) for f in ([files] if isinstance(files, str) else files)]


_PCT = '; a Proxmox CT without sshd is reached through its node with access = "pct" in its target section'


@dataclass
class _Leg:
    """One hop's unopened Connection; ``label`` names it in errors (None: the destination, by address).
    The first hop may be reached through a ``ProxyCommand``."""

    conn: Any
    label: str | None
    proxy_command: str | None = None


def _exit_code(process: Any, grace: float = 0.5) -> int | None:
    """A ProxyCommand's exit code, or None while it runs. It closes its output just before it exits, so the
    handshake can fail on that EOF an instant before the exit: give it a moment to say why it ended."""
    import subprocess

    try:
        return process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        return None


def _start_proxy_command(command: str, timeout: float) -> Any:
    """The ProxyCommand as a socket-like object, ``%h``/``%p`` already expanded by the SSH config lookup.

    paramiko's own class spins until the timeout once the command has exited; this one reads EOF as
    EOF, so a refused jump gives its error at once.
    """
    import select

    sshlib.paramiko()
    from paramiko.proxy import ProxyCommand

    class Proxy(ProxyCommand):
        def recv(self, size: int) -> bytes:
            ready, _, _ = select.select([self.process.stdout], [], [], self.timeout)
            if not ready:
                raise socket.timeout()
            return os.read(self.process.stdout.fileno(), size)

        def close(self) -> None:
            if self.process.poll() is None:
                self.process.terminate()

    try:
        proxy = Proxy(command)
    except (OSError, ValueError) as exc:
        raise TransportError(f"cannot start the ProxyCommand {command!r}: {exc}",
                             hint="fix the ProxyCommand line in the SSH config") from exc
    proxy.settimeout(timeout)
    return proxy


def _close(legs: list[_Leg]) -> None:
    """Close the destination first, then the jump hosts its channel ran through."""
    for leg in reversed(legs):
        leg.conn.close()


def _aead_first(sock: Any, **kwargs: Any) -> Any:
    """A paramiko Transport that prefers AES-GCM: one authenticated-encryption call per packet instead of
    a cipher and a separate MAC, which roughly doubles bulk throughput (pushes) at no cost in security.
    Servers without it negotiate the usual CTR + HMAC."""
    paramiko = sshlib.paramiko()

    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    aead = tuple(c for c in options.ciphers if c.endswith("-gcm@openssh.com"))
    options.ciphers = aead + tuple(c for c in options.ciphers if c not in aead)
    return transport


class NotStartedError(TransportError):
    """The connection was found dead before the command started: it never ran, and may be sent again."""


class _Retryable(Exception):
    """A connect failure worth another attempt (refused, reset): wraps the error to raise at the end."""

    def __init__(self, error: TransportError) -> None:
        super().__init__(error.message)
        self.error = error
