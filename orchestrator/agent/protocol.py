"""The wire format between controller and agent, shared by both sides.

Request (stdin): one JSON line ``{"v": PROTOCOL, "root": ..., "ops": [{"op": name, "args": {...}}],
"lock": seconds-or-null, "payload": bytes}`` followed by that many raw payload bytes, which the op
that takes them reads as a stream (``blob_stream.Payload``).
Response (stdout): ``MARK_BEGIN + json + MARK_END`` so that shell noise (motd, rc files) around it is
harmless. The ops run in order and stop at the first failure; ``results`` holds one entry per op run.
A request with ``"expect"`` (what the Proxmox API says the CT is) runs only on that machine: its answer carries
``who`` (this machine's facts, ``identity.py``), and where they differ a ``fatal`` of kind ``identity`` and no
results.
"""

from __future__ import annotations

import json

PROTOCOL = 1
MARK_BEGIN = b"\n@@ORCH-ENVELOPE@@"
MARK_END = b"@@END@@\n"
# a streaming op's frames, before its envelope: marker, a JSON header line, then header["n"] raw bytes
MARK_FRAME = b"\n@@ORCH-FRAME@@"

# error kinds the agent reports; the controller maps them onto orch's exception tree
KINDS = ("input", "safety", "conflict", "notfound", "agent", "identity")  # identity: another machine answered


class AgentFailure(Exception):
    """A failure the agent reports back inside the envelope (never a traceback)."""

    def __init__(self, kind: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.kind = kind if kind in KINDS else "agent"
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict:
        return {"kind": self.kind, "message": self.message, "hint": self.hint}


def frame(obj: dict) -> bytes:
    return MARK_BEGIN + json.dumps(obj, separators=(",", ":")).encode() + MARK_END


def data_frame(header: dict, data: bytes) -> bytes:
    return frame_head(header, len(data)) + data


def frame_head(header: dict, size: int) -> bytes:
    """A data frame's start, for ``size`` bytes written right after it."""
    return MARK_FRAME + json.dumps({**header, "n": size}, separators=(",", ":")).encode() + b"\n"


def unframe(data: bytes) -> dict | None:
    """The last envelope in ``data``, or None when there is none."""
    start = data.rfind(MARK_BEGIN)
    if start < 0:
        return None
    end = data.find(MARK_END, start)
    if end < 0:
        return None
    return json.loads(data[start + len(MARK_BEGIN):end])


def manifest_id(entries: list) -> str:
    """The revision id: a hash over the sorted (path, sha256, mode) triples.

    Only content and mode count, never times, so the same tree always gets the same id.
    """
    import hashlib

    canon = sorted((e["path"], e["sha256"], int(e["mode"]) & 0o777) for e in entries)
    return hashlib.sha256(json.dumps(canon, separators=(",", ":")).encode()).hexdigest()[:16]
