"""A Proxmox VE API stand-in: HTTPS on 127.0.0.1, the real response shapes, the real errors.

Proxmox VE cannot run here, so this serves the part of ``/api2/json`` orch uses in the shapes of
the PVE API schema (pve-docs' API viewer data, checked by tests/unit/test_pve_standin.py): errors travel as HTTP reason phrases with a body of
``{"data": null}``, token auth is checked on every call, and list endpoints are silently filtered
for tokens without VM.Audit. The containers come from a backend (``pve_backends``).

    with start_standin(MemoryBackend([MemoryCt(200)])) as api:
        ProxmoxAPI(api.host, port=api.port, user="root@pam", token_name="orch",
                   token_value=api.token_secret, verify_ssl=api.cert_path)
        api.faults.node_offline = True          # faults can be flipped while it runs

Endpoints: ``GET /cluster/resources``, ``GET /nodes``, ``GET /nodes/{node}/lxc/{vmid}/status/current``,
``POST .../status/start|stop|shutdown``, ``GET /nodes/{node}/tasks/{upid}/status``,
``GET /nodes/{node}/lxc/{vmid}/interfaces``, ``GET /nodes/{node}/lxc/{vmid}/config``.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import re
import shutil
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.testbed.pve_backends import Backend, BackendError

ALL_PRIVILEGES = frozenset({"VM.Audit", "VM.PowerMgmt"})
DEFAULT_TOKEN_ID = "root@pam!orch"
DEFAULT_SECRET = "5d1e4c7a-8f0b-4d2e-9a6c-3b7f1e2d4c5a"


@dataclass
class Token:
    """An API token's secret and privileges on ``/vms`` (empty: privilege separation, sees nothing)."""

    secret: str
    privileges: frozenset[str] = ALL_PRIVILEGES


@dataclass
class Faults:
    """Knobs a test turns while the stand-in runs; each one is a failure users really meet."""

    node_offline: bool = False              #: every /nodes/{node}/... answers 595
    delay: float = 0.0                      #: seconds to sleep before answering any request
    task_fails: bool = False                #: start tasks end with "startup for container 'N' failed"
    task_exitstatus: str = "OK"             #: exitstatus of tasks that succeed (e.g. "WARNINGS: 2")
    task_never_finishes: bool = False       #: tasks stay "running" forever
    task_running_polls: int = 1             #: status polls a task answers "running" before it ends
    task_status_400_polls: int = 0          #: first polls of a new task's status answer 400
    link_local_polls: int = 0               #: interface polls after a start that show only lo + fe80::
    status_lag_polls: int = 0               #: status polls after a start task that still say "stopped"
    interfaces_null: bool = False           #: /interfaces answers null even for a running CT
    interfaces_unsupported: bool = False    #: /interfaces answers 501, as PVE before 8.1 does


class ApiError(Exception):
    """An answer with an error status; ``reason`` is sent as the HTTP reason phrase, as PVE does."""

    def __init__(self, status: int, reason: str, errors: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.errors = status, reason, errors


@dataclass
class _Task:
    upid: str
    node: str
    pid: int
    pstart: int
    starttime: int
    type: str
    id: str
    user: str
    polls: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    exitstatus: str = "OK"


def make_cert(directory: str) -> tuple[str, str]:
    """A self-signed certificate for IP:127.0.0.1 (and localhost); returns (cert, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pve-standin")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=False, content_commitment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = os.path.join(directory, "pve-standin.pem"), os.path.join(directory, "pve-standin.key")
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as fh:
        fh.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    os.chmod(key_path, 0o600)
    return cert_path, key_path


class Api:
    """The request router and state behind the HTTP handler (no sockets in here)."""

    def __init__(self, backend: Backend, node: str, tokens: dict[str, Token], qemu: dict[int, str],
                 other_nodes: list[str]) -> None:
        self.backend, self.node, self.tokens, self.qemu = backend, node, tokens, qemu
        self.other_nodes = other_nodes
        self.faults = Faults()
        self.tasks: dict[str, _Task] = {}
        self.requests: list[tuple[str, str]] = []
        self._link_local_left: dict[int, int] = {}
        self._status_lag_left: dict[int, int] = {}
        self._lock = threading.RLock()
        self._pid = 100000
        self._boot = int(time.time()) - 3600

    def authenticate(self, header: str | None) -> str:
        """The token id of a valid ``PVEAPIToken=USER@REALM!TOKENID=SECRET`` header."""
        if header and header.startswith("PVEAPIToken="):
            token_id, _, secret = header[len("PVEAPIToken="):].partition("=")
            token = self.tokens.get(token_id)
            if token is not None and secret == token.secret:
                return token_id
        raise ApiError(401, "authentication failure")

    def handle(self, method: str, path: str, query: dict[str, str], token_id: str) -> Any:
        with self._lock:
            self.requests.append((method, path))
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] != ["api2", "json"]:
            raise ApiError(404, "Not Found")
        parts = parts[2:]
        privileges = self.tokens[token_id].privileges
        if method == "GET" and parts == ["cluster", "resources"]:
            return self.resources(query.get("type"), privileges)
        if method == "GET" and parts == ["nodes"]:
            return self.nodes()
        if len(parts) >= 2 and parts[0] == "nodes":
            return self.node_call(method, parts[1], parts[2:], token_id, privileges)
        raise ApiError(501, f"Method '{method} /{'/'.join(parts)}' not implemented")

    def resources(self, kind: str | None, privileges: frozenset[str]) -> list[dict[str, Any]]:
        if kind not in (None, "vm", "node", "storage", "sdn"):
            enum = "value '{}' does not have a value in the enumeration 'vm, storage, node, sdn'"
            raise ApiError(400, "Parameter verification failed.", {"type": enum.format(kind)})
        out: list[dict[str, Any]] = []
        if kind in (None, "node"):
            out += [{"id": f"node/{n}", "type": "node", "node": n, "status": s, "level": ""}
                    for n, s in self.node_states()]
        if kind in (None, "vm") and "VM.Audit" in privileges:
            for vmid in self.backend.vmids():
                status = self.backend.status(vmid)
                out.append({
                    "id": f"lxc/{vmid}", "type": "lxc", "vmid": vmid, "node": self.node,
                    "name": self.backend.name(vmid), "status": status, "template": 0, "tags": "",
                    "maxcpu": 2, "cpu": 0.01 if status == "running" else 0, "maxmem": 2147483648,
                    "mem": 104857600 if status == "running" else 0, "maxdisk": 8589934592, "disk": 0,
                    "uptime": 120 if status == "running" else 0, "diskread": 0, "diskwrite": 0,
                    "netin": 0, "netout": 0,
                })
            for vmid, name in sorted(self.qemu.items()):
                out.append({"id": f"qemu/{vmid}", "type": "qemu", "vmid": vmid, "node": self.node, "name": name,
                            "status": "stopped", "template": 0, "maxcpu": 4, "maxmem": 4294967296, "uptime": 0})
        return out

    def node_states(self) -> list[tuple[str, str]]:
        own = "offline" if self.faults.node_offline else "online"
        return [(self.node, own), *[(n, "online") for n in self.other_nodes]]

    def nodes(self) -> list[dict[str, Any]]:
        return [
            {"node": n, "status": s, "level": "", "id": f"node/{n}", "type": "node",
             **({"cpu": 0.02, "maxcpu": 2, "mem": 1 << 30, "maxmem": 4 << 30, "uptime": 3600} if s == "online" else {})}
            for n, s in self.node_states()
        ]

    def node_call(self, method: str, node: str, rest: list[str], token_id: str, privileges: frozenset[str]) -> Any:
        if node != self.node and node not in self.other_nodes:
            raise ApiError(596, f"no such cluster node '{node}'")
        if node == self.node and self.faults.node_offline:
            raise ApiError(595, f"Errors during connection establishment, proxy handshake: No route to host ({node})")
        if len(rest) == 3 and rest[0] == "tasks" and rest[2] == "status" and method == "GET":
            return self.task_status(node, rest[1])
        if len(rest) < 3 or rest[0] != "lxc" or not rest[1].isdigit():
            raise ApiError(501, f"Method '{method} /nodes/{node}/{'/'.join(rest)}' not implemented")
        vmid, action = int(rest[1]), "/".join(rest[2:])
        if node != self.node or vmid not in self.backend.vmids():
            raise ApiError(500, f"Configuration file 'nodes/{node}/lxc/{vmid}.conf' does not exist")
        if method == "GET" and action in ("status/current", "interfaces", "config"):
            self.require(privileges, vmid, "VM.Audit")
            if action == "interfaces" and self.faults.interfaces_unsupported:
                raise ApiError(501, f"Method 'GET /nodes/{node}/lxc/{vmid}/interfaces' not implemented")
            return getattr(self, action.replace("status/", "status_"))(vmid)
        if method == "POST" and action in ("status/start", "status/stop", "status/shutdown"):
            self.require(privileges, vmid, "VM.PowerMgmt")
            return self.power(vmid, action.split("/")[1], token_id)
        raise ApiError(501, f"Method '{method} /nodes/{node}/lxc/{vmid}/{action}' not implemented")

    @staticmethod
    def require(privileges: frozenset[str], vmid: int, privilege: str) -> None:
        if privilege not in privileges:
            raise ApiError(403, f"Permission check failed (/vms/{vmid}, {privilege})")

    def status_current(self, vmid: int) -> dict[str, Any]:
        status = self.backend.status(vmid)
        with self._lock:
            if status == "running" and self._status_lag_left.get(vmid, 0) > 0:
                self._status_lag_left[vmid] -= 1
                status = "stopped"
        running = status == "running"
        out: dict[str, Any] = {
            "vmid": vmid, "type": "lxc", "name": self.backend.name(vmid), "status": status,
            "cpus": 2, "cpu": 0.01 if running else 0, "mem": 104857600 if running else 0, "maxmem": 2147483648,
            "swap": 0, "maxswap": 536870912, "disk": 0, "maxdisk": 8589934592, "uptime": 120 if running else 0,
            "diskread": 0, "diskwrite": 0, "netin": 0, "netout": 0, "ha": {"managed": 0}, "tags": "",
        }
        if running:
            out["pid"] = 4242
        return out

    def interfaces(self, vmid: int) -> list[dict[str, Any]] | None:
        if self.faults.interfaces_null or self.backend.status(vmid) != "running":
            return None
        ifaces = self.backend.interfaces(vmid)
        with self._lock:
            if self._link_local_left.get(vmid, 0) > 0:
                self._link_local_left[vmid] -= 1
                ifaces = [_link_local_only(i) for i in ifaces]
        return ifaces

    def config(self, vmid: int) -> dict[str, Any]:
        conf = self.backend.config(vmid)
        conf["digest"] = hashlib.sha1(json.dumps(conf, sort_keys=True).encode()).hexdigest()
        return conf

    def power(self, vmid: int, action: str, token_id: str) -> str:
        running = self.backend.status(vmid) == "running"
        if action == "start" and running:
            raise ApiError(500, f"CT {vmid} already running")
        if action != "start" and not running:
            raise ApiError(500, f"CT {vmid} not running")
        task = self.new_task(f"vz{action}", str(vmid), token_id)
        threading.Thread(target=self.run_task, args=(task, vmid, action), daemon=True).start()
        return task.upid

    def new_task(self, kind: str, ident: str, user: str) -> _Task:
        with self._lock:
            self._pid += 7
            now = int(time.time())
            pstart = (now - self._boot) * 100
            upid = f"UPID:{self.node}:{self._pid:08X}:{pstart:08X}:{now:08X}:{kind}:{ident}:{user}:"
            task = _Task(upid, self.node, self._pid, pstart, now, kind, ident, user)
            self.tasks[upid] = task
            return task

    def run_task(self, task: _Task, vmid: int, action: str) -> None:
        try:
            if action == "start" and self.faults.task_fails:
                raise BackendError(f"startup for container '{vmid}' failed")
            if action == "start":
                self.backend.start(vmid)
                with self._lock:
                    self._link_local_left[vmid] = self.faults.link_local_polls
                    self._status_lag_left[vmid] = self.faults.status_lag_polls
            else:
                self.backend.stop(vmid)
            task.exitstatus = self.faults.task_exitstatus
        except BackendError as exc:
            task.exitstatus = str(exc)
        finally:
            task.done.set()

    def task_status(self, node: str, upid: str) -> dict[str, Any]:
        task = self.tasks.get(upid)
        if task is None or task.node != node:
            raise ApiError(400, "Parameter verification failed.", {"upid": "unable to parse worker upid"})
        with self._lock:
            task.polls += 1
            polls = task.polls
        if polls <= self.faults.task_status_400_polls:
            raise ApiError(400, "Parameter verification failed.", {"upid": "no such task"})
        out: dict[str, Any] = {
            "upid": task.upid, "node": task.node, "pid": task.pid, "pstart": task.pstart,
            "starttime": task.starttime, "type": task.type, "id": task.id, "user": task.user, "status": "running",
        }
        finished = polls > self.faults.task_status_400_polls + self.faults.task_running_polls
        if self.faults.task_never_finishes or not finished or not task.done.wait(timeout=5.0):
            return out
        return {**out, "status": "stopped", "exitstatus": task.exitstatus}


def _link_local_only(iface: dict[str, Any]) -> dict[str, Any]:
    if iface["name"] == "lo":
        return iface
    kept = [a for a in iface.get("ip-addresses", []) if a["ip-address"].lower().startswith("fe80:")]
    out = {k: v for k, v in iface.items() if k not in ("inet", "inet6", "ip-addresses")}
    out["ip-addresses"] = kept
    if kept:
        out["inet6"] = f"{kept[-1]['ip-address']}/{kept[-1]['prefix']}"
    return out


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self, method: str) -> None:
        api = self.server.api
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            if api.faults.delay and self.server.stopping.wait(api.faults.delay):
                return
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            query.update({k: v[-1] for k, v in parse_qs(body).items()})
            token_id = api.authenticate(self.headers.get("Authorization"))
            self._send(200, "OK", {"data": api.handle(method, url.path, query, token_id)})
        except ApiError as exc:
            payload: dict[str, Any] = {"data": None}
            if exc.errors is not None:
                payload["errors"] = exc.errors
            self._send(exc.status, exc.reason, payload)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        except Exception as exc:  # a backend failure is a 500 with its text, as in PVE
            self._send(500, str(exc) or type(exc).__name__, {"data": None})

    def _send(self, status: int, reason: str, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status, " ".join(reason.split()))
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "max-age=0")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: Api, context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api
        self.stopping = threading.Event()
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class StandIn:
    """A running stand-in; use ``start_standin`` to make one, ``stop()`` (or ``with``) to end it."""

    def __init__(self, api: Api, server: _Server, tmpdir: str, cert_path: str, token_id: str) -> None:
        self.api, self._server, self._tmpdir = api, server, tmpdir
        self.host, self.port = "127.0.0.1", server.server_address[1]
        self.cert_path = cert_path
        self.base_url = f"https://{self.host}:{self.port}/api2/json"
        self.token_id = token_id
        self.token_secret = api.tokens[token_id].secret
        self.faults = api.faults
        self.backend = api.backend
        self.node = api.node
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def tokens(self) -> dict[str, Token]:
        return self.api.tokens

    @property
    def requests(self) -> list[tuple[str, str]]:
        """Every (method, path) served so far, for tests that count polls."""
        return self.api.requests

    def stop(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"StandIn({self.base_url}, node={self.node!r}, token={self.token_id!r})"


def start_standin(
    backend: Backend,
    *,
    node: str = "pve1",
    tokens: dict[str, Token] | None = None,
    token_id: str = DEFAULT_TOKEN_ID,
    qemu: dict[int, str] | None = None,
    other_nodes: list[str] | None = None,
) -> StandIn:
    """Serve ``backend``'s containers as node ``node`` on a free port of 127.0.0.1.

    ``tokens`` maps token ids (``user@realm!name``) to ``Token``; by default one token ``token_id``
    with every privilege. ``token_id`` picks which token ``.token_id``/``.token_secret`` report.
    ``qemu`` adds VMs to ``/cluster/resources`` (so CT lookups must filter by type);
    ``other_nodes`` are cluster members without containers (a CT looked up there "does not exist").
    """
    tokens = dict(tokens) if tokens else {token_id: Token(DEFAULT_SECRET)}
    if token_id not in tokens:
        token_id = next(iter(tokens))
    if not re.fullmatch(r"[\w.-]+", node):
        raise ValueError(f"bad node name {node!r}")
    tmpdir = tempfile.mkdtemp(prefix="pve-standin-")
    cert_path, key_path = make_cert(tmpdir)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    api = Api(backend, node, tokens, dict(qemu or {}), list(other_nodes or []))
    return StandIn(api, _Server(api, context), tmpdir, cert_path, token_id)
