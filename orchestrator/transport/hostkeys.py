"""known_hosts helpers for the SSH transport: fingerprints as OpenSSH prints them, and which lines
name a host (plain or hashed), so that a host-key error can say exactly what to fix."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass


def fingerprint(key_blob: bytes) -> str:
    """The SHA256 fingerprint as OpenSSH prints it: ``SHA256:<unpadded base64>``."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key_blob).digest()).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """How OpenSSH (and paramiko) name a host in known_hosts: ``host`` or ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


@dataclass
class KnownEntry:
    """One known_hosts line that names a host."""

    file: str
    line: int
    key_type: str


def find_known_entries(files: list[str], name: str) -> list[KnownEntry]:
    """Every line of ``files`` naming ``name`` (plain or hashed), for messages that say what to fix."""
    from paramiko.hostkeys import HostKeyEntry, HostKeys

    found = []
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except OSError:
            continue
        for lineno, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                entry = HostKeyEntry.from_line(text, lineno)
            except Exception:
                continue
            if entry is None:
                continue
            for pattern in entry.hostnames:
                hit = HostKeys.hash_host(name, pattern) == pattern if pattern.startswith("|1|") else pattern == name
                if hit:
                    found.append(KnownEntry(path, lineno, entry.key.get_name()))
                    break
    return found
