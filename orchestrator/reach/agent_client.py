"""The controller's side of the agent: ship it, call it, translate its answers.

The agent travels as one zipapp (the agent package and ``orchestrator.batching`` for training scripts),
named by its content hash: ``<root>/agent/agent-<hash>.pyz``. A call simply runs that file; if the target
lacks it (first use, or a new version) the call fails fast with "can't open file", the zip is pushed and
the call repeated, so an up-to-date target costs no extra round trip.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import itertools
import json
import threading
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..agent.protocol import MARK_BEGIN, MARK_FRAME, PROTOCOL, unframe
from ..errors import (AgentError, ConflictError, InputError, NotFoundError, OrchError, SafetyError, TransportTimeout,
                      WrongMachine)
from .transport.base import Transport
from .transport.local import LocalTransport

_KIND_TO_ERROR = {"input": InputError, "safety": SafetyError, "conflict": ConflictError,
                  "notfound": NotFoundError, "agent": AgentError, "identity": WrongMachine}
_ZIP_LOCK = threading.Lock()  # the agent's files are read, hashed and zipped once, by one thread


def _package_files() -> list[tuple[str, Path]]:
    """(name in zip, file) for everything the agent zip carries, in a fixed order."""
    pkg = Path(__file__).resolve().parents[1]
    out = [("orchestrator/__init__.py", pkg / "__init__.py")]
    for sub in ("agent", "batching"):
        folder = pkg / sub
        if folder.is_dir():
            for path in sorted(folder.rglob("*.py")):
                out.append((f"orchestrator/{path.relative_to(folder.parent).as_posix()}", path))
    return out


def agent_zip() -> tuple[str, bytes]:
    """(content hash, zip bytes) of the agent; deterministic, built once per process (threads asking many
    targets at once wait for the one build, rather than each compressing the agent again)."""
    with _ZIP_LOCK:
        return _agent_digest(), _agent_zip_bytes()


def agent_digest() -> str:
    """The agent's content hash, which names its file on a target: of its files' names and bytes, so a command
    that pushes no agent never compresses one (~20 ms)."""
    with _ZIP_LOCK:
        return _agent_digest()


@functools.cache
def _agent_zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in _agent_files():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return buf.getvalue()


@functools.cache
def _agent_digest() -> str:
    h = hashlib.sha256()
    for name, data in _agent_files():
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


@functools.cache
def _agent_files() -> tuple[tuple[str, bytes], ...]:
    """(name in zip, bytes) of the agent, read once per process."""
    from ..agent.strict import FILES

    boot = Path(__file__).resolve().parents[1] / "agent" / "bootstrap.py"
    files = [(name, path.read_bytes()) for name, path in [("__main__.py", boot), *_package_files()]]
    listing = json.dumps({name: zlib.crc32(data) for name, data in files}, sort_keys=True).encode()
    return (*files, (FILES, listing))  # what the bootstrap checks its unpacked copy against


@dataclass
class Stream:
    """A payload too big to hold: its length, and a way to produce its bytes (again, if a call is repeated)."""

    size: int
    open: Callable[[], Iterable[bytes]]


class Frames:
    """Splits a streaming op's stdout into its frames (handed to ``on_frame`` whole, in order) and the rest.

    A frame cut off by a dropped link is never handed on; the rest (shell noise, the envelope) is kept.
    """

    def __init__(self, on_frame: Callable[[dict, bytes], None]) -> None:
        self.on_frame = on_frame
        self.buf = bytearray()
        self.rest = bytearray()
        self.head: tuple[dict, int, int] | None = None  # the frame at the buffer's start: header, data start, end

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while True:
            if self.head is None:
                start = self.buf.find(MARK_FRAME)
                if start < 0:  # keep what may be the start of a marker
                    cut = max(0, len(self.buf) - len(MARK_FRAME) + 1)
                    self.rest += self.buf[:cut]
                    del self.buf[:cut]
                    return
                self.rest += self.buf[:start]
                del self.buf[:start]
                eol = self.buf.find(b"\n", len(MARK_FRAME))
                if eol < 0:
                    return
                header = json.loads(self.buf[len(MARK_FRAME):eol])
                self.head = (header, eol + 1, eol + 1 + int(header["n"]))  # parsed once, however many pieces
            header, begin, end = self.head
            if len(self.buf) < end:
                return
            data = bytes(memoryview(self.buf)[begin:end])
            del self.buf[:end]
            self.head = None
            self.on_frame(header, data)

    def leftover(self) -> bytes:
        self.head = None
        return bytes(self.rest + self.buf)


@dataclass
class Op:
    """One agent operation: a name and its JSON arguments."""

    name: str
    args: dict = field(default_factory=dict)


TIMEOUT_SETTING = "[ssh] command_timeout (read-only commands: [ssh] read_timeout)"


def connect_early(target, files: list = ()) -> None:
    """Have ``target``'s connection and its resident agent readied in the background while the command goes on
    (``keeper.client.early``): an SSH target with no keeper up, as after a break; nothing otherwise. ``files``: what
    the target was resolved from (orch.toml, the current target's file), for the next command's recall."""
    if target.connect is None or target.spec.kind not in ("ssh", "proxmox"):
        return
    from .keeper.client import early

    early(target.connect(), lambda: [target.python, agent_file(target.root)], files)


def agent_file(root: str) -> str:
    """Where this orch's agent lives under ``root`` on a target: its name carries its content hash."""
    return f"{root.rstrip('/')}/agent/agent-{agent_digest()}.pyz"


class AgentClient:
    """Runs batches of agent operations on one target over one transport."""

    def __init__(self, transport: Transport, root: str, python: str = "python3",
                 timeout: float | None = 300.0, timeout_setting: str = TIMEOUT_SETTING) -> None:
        self.transport = transport
        self.root = root
        self.python = python
        self.timeout = timeout
        self.timeout_setting = timeout_setting  # named in the hint when a call runs out of time
        self.agent_path = agent_file(root)
        self.calls = 0
        self.pushes = 0
        self.timings: dict[str, float] = {}  # ms spent in each op on the target, for benchmarks
        self._checked = not isinstance(transport, LocalTransport)  # remote: the agent's bootstrap checks

    def _check_local(self) -> None:
        """This machine: refuse a root or agent folder others could write, before running anything from it.

        The bootstrap checks again, but only code that is not under the root can vouch for the agent
        file itself: a copy that differs from this orch's agent is replaced (the folder is ours).
        """
        import shutil

        from ..agent import strict

        agent_dir = self.agent_path.rsplit("/", 1)[0]
        unpacked = self.agent_path[:-4] + ".d"
        for _ in range(2):  # before creating anything, then with orch's own folders made
            why = strict.problem(self.root, [agent_dir, self.agent_path, unpacked])
            if why:
                raise SafetyError(why, hint=strict.HINT)
            strict.make_dirs(agent_dir)
        try:
            with open(self.agent_path, "rb") as fh:
                same = fh.read() == agent_zip()[1]
        except FileNotFoundError:
            same = True  # pushed on the first call
        if not same:
            shutil.rmtree(unpacked, ignore_errors=True)
            self.push_agent()
        self._checked = True

    def push_agent(self) -> None:
        _, data = agent_zip()
        self.transport.put(data, self.agent_path, 0o644)
        self.pushes += 1

    def call(self, ops: list[Op], *, payload: bytes | Stream = b"", lock: float | None = None,
             what: str = "operation", timeout: float | None = None,
             on_frame: Callable[[dict, bytes], None] | None = None, journal: dict | None = None,
             bulk: bool = False) -> list[Any]:
        """Run ``ops`` in order in one agent process; return their values or raise the first failure.

        A ``Stream`` payload is sent as it is produced, and ``timeout`` then limits the time without
        progress instead of the whole call. So does ``on_frame``, which takes each frame a streaming op
        writes as it arrives (the transport must stream: ``transport.streams``). ``bulk`` sends a ``Stream`` the
        way big ones go (``Transport.run_bulk``: over OpenSSH where it can). ``journal`` (``exp_id``,
        ``registry``, ``project``) has a locked call record its steps in that run's folder as they finish.
        """
        if not self._checked:
            self._check_local()
        streamed = isinstance(payload, Stream)
        size = payload.size if isinstance(payload, Stream) else len(payload)
        request = {"v": PROTOCOL, "root": self.root, "ops": [{"op": o.name, "args": o.args} for o in ops],
                   "lock": lock, "what": what, "payload": size} | ({"journal": journal} if journal else {})
        expect = self.transport.identity  # a Proxmox CT: the agent runs nothing on another machine
        if expect is not None:
            request["expect"] = expect.wire()
        head = json.dumps(request, separators=(",", ":")).encode() + b"\n"

        def run() -> Any:
            stdin = itertools.chain([head], payload.open()) if isinstance(payload, Stream) else head + payload
            limit = timeout or self.timeout
            self.calls += 1
            send = self.transport.run_agent  # a resident agent, where one serves
            if on_frame is not None:
                frames = Frames(on_frame)
                result = send(argv, input=stdin, timeout=None, stall=limit, output=frames.feed)
                result.stdout = frames.leftover()
                return result
            if streamed and bulk:
                assert isinstance(payload, Stream)
                return self.transport.run_bulk(argv, open=lambda: itertools.chain([head], payload.open()),
                                               stall=limit)
            if streamed:
                return send(argv, input=stdin, timeout=None, stall=limit)
            return send(argv, input=stdin, timeout=limit)

        def answer() -> dict:
            try:
                result = run()
            except TransportTimeout as exc:
                if timeout is not None or streamed:
                    raise
                raise TransportTimeout(f"{exc.message} ({what})", hint=f"the target may be frozen or overloaded: "
                                       f"check it, or raise {self.timeout_setting} in orch.toml if it is just slow") \
                    from None
            envelope = _envelope(result.stdout)
            if envelope is None and self._agent_missing(result):
                self.push_agent()
                result = run()
                envelope = _envelope(result.stdout)
            if envelope is None:
                raise self._no_envelope(result)
            return envelope

        argv = [self.python, self.agent_path]
        envelope = answer()
        if expect is not None and envelope.get("fatal", {}).get("kind") == "identity":
            # nothing ran there: ask the API where the CT is now, and go there (or refuse, saying what answered)
            self.transport.retarget(expect.resolve_again(str(envelope["fatal"].get("message"))))
            request["expect"] = expect.wire()
            head = json.dumps(request, separators=(",", ":")).encode() + b"\n"
            envelope = answer()
        if envelope.get("fatal", {}).get("kind") == "identity":
            raise WrongMachine(str(envelope["fatal"].get("message")), hint=_wrong_hint(expect))
        if expect is not None:
            expect.answered(envelope.get("who"))
        values = []
        for op, item in zip(ops, envelope["results"]):
            if not item["ok"]:
                raise _error(item["error"], values)
            self.timings[op.name] = self.timings.get(op.name, 0.0) + item["ms"]
            values.append(item["value"])
        if "fatal" in envelope:
            raise _error(envelope["fatal"], values)
        if len(values) < len(ops):
            raise AgentError(f"the agent answered {len(values)} of {len(ops)} operations without saying why",
                             hint=BROKEN_HINT, partial=values)
        return values

    def one(self, op: str, /, **args: Any) -> Any:
        return self.call([Op(op, args)])[0]

    @staticmethod
    def _agent_missing(result: Any) -> bool:
        err = result.stderr.decode("utf-8", "replace")
        return result.exit_code != 0 and ("can't open file" in err or "No such file" in err)

    def _no_envelope(self, result: Any) -> AgentError:
        err = result.tail(8)
        last = err.splitlines()[-1].strip() if err.strip() else "no output"
        if result.exit_code == 127 or ("not found" in err and self.python in err):
            return AgentError(f"{self.python} was not found on the target",
                              hint="install python3 (3.10 or newer) there, or set the target's python = '/path'")
        if MARK_BEGIN in result.stdout:
            return AgentError("the agent's answer was cut off before its end", hint=BROKEN_HINT,
                              detail=result.stdout[-2000:].decode("utf-8", "replace"))
        return AgentError(f"the agent on the target gave no answer (exit {result.exit_code}): {last[:300]}",
                          hint="check the target's python3 and free space under its root", detail=err or None)


def _wrong_hint(expect: Any) -> str:
    from .identity import HINT

    return HINT.format(vmid=getattr(expect, "vmid", "?"), address=getattr(expect, "address", "its address"))


BROKEN_HINT = "the target's agent or its python may be broken: rerun, and check free space under the target's root"


def _envelope(stdout: bytes) -> dict | None:
    """The agent's envelope, checked for shape; None when there is none (the agent did not run)."""
    try:
        envelope = unframe(stdout)
    except (ValueError, RecursionError):  # markers around garbage: a truncated or corrupted answer
        raise AgentError("the agent's answer is not valid JSON (truncated or corrupted on the way)",
                         hint=BROKEN_HINT, detail=stdout[-2000:].decode("utf-8", "replace")) from None
    if envelope is None:
        return None
    results = envelope.get("results", []) if isinstance(envelope, dict) else None
    ok = isinstance(results, list) and all(
        isinstance(r, dict) and (r.get("ok") is True and "value" in r and isinstance(r.get("ms", 0), (int, float))
                                 or r.get("ok") is False and isinstance(r.get("error"), dict)) for r in results)
    if not ok or not isinstance(envelope.get("fatal", {}), dict):
        raise AgentError("the agent's answer is not a valid envelope", hint=BROKEN_HINT,
                         detail=json.dumps(envelope)[:2000])
    envelope["results"] = [{"ms": 0.0, **r} for r in results]
    return envelope


def _error(info: dict, partial: list) -> OrchError:
    """The agent's error as orch's exception, with its traceback and the values of the ops done before it."""
    kind = info.get("kind")
    cls = _KIND_TO_ERROR.get(kind, AgentError) if isinstance(kind, str) else AgentError
    message = str(info.get("message") or "the agent failed").replace("\n", " ")
    detail = info.get("traceback")
    hint = str(info.get("hint") or "") or (BROKEN_HINT if cls is AgentError else None)
    return cls(message, hint=hint,
               detail=detail if isinstance(detail, str) else None, partial=partial)


def decode_log(value: dict) -> bytes:
    return base64.b64decode(value.get("data", ""))

