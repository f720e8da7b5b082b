"""The SSH transport's known_hosts policy, applied to every hop (jump hosts, the Proxmox node, the
destination): unknown keys refused or, with --trust-new-host, recorded; changed keys always refused.
Also fingerprints as OpenSSH prints them, and which lines name a host (plain or hashed), so that a
host-key error can say exactly what to fix."""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from typing import Any

from ...errors import HostKeyError
from . import sshlib


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
    sshlib.paramiko()
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


class KnownHosts:
    """Strict checking against ``files`` (plus ``trust_file``, where --trust-new-host records keys).

    ``label`` names a hop that is not simply the destination, e.g. ``the jump host bastion (10.0.0.5:22)``;
    errors about the destination name it by its known_hosts name.
    """

    def __init__(self, files: list[str], trust_file: str, trust_new_host: bool = False) -> None:
        self.trust_file = trust_file
        self.files = list(dict.fromkeys([*files, trust_file]))
        self.trust_new_host = trust_new_host

    def install(self, client: Any, label: str | None = None) -> None:
        """Load every file into a paramiko ``SSHClient``; unknown keys go to ``unknown``, never auto-added."""
        paramiko = sshlib.paramiko()

        keys = client.get_host_keys()
        for path in self.files:
            if os.path.isfile(path):
                try:
                    keys.load(path)
                except (OSError, paramiko.SSHException) as exc:
                    raise HostKeyError(f"cannot read known_hosts file {path}: {exc}",
                                       hint="fix or remove the broken line") from exc
        policy = self

        class Strict(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
                policy.unknown(client, hostname, key, label)

        client.set_missing_host_key_policy(Strict())

    def unknown(self, client: Any, name: str, key: Any, label: str | None = None) -> None:
        """A key not in known_hosts: refuse, or record it with --trust-new-host."""
        if find_known_entries(self.files, name):
            raise self.changed(name, key, label)
        if not self.trust_new_host:
            raise HostKeyError(
                f"unknown host key for {label or name}: {key.get_name()} {fingerprint(key.asbytes())}",
                hint="verify this fingerprint with the host's owner (ssh-keygen -lf on the host), then rerun "
                     "with --trust-new-host to record it, or add it with ssh-keyscan / one ssh login")
        self._record(name, key)
        client.get_host_keys().add(name, key.get_name(), key)

    def changed(self, name: str, key: Any, label: str | None = None) -> HostKeyError:
        """A changed key is refused always, --trust-new-host or not, naming the line to fix."""
        known = find_known_entries(self.files, name)
        first = known[0] if known else KnownEntry("a known_hosts file", 0, "different")
        return HostKeyError(
            f"host key for {label or name} CHANGED: it now offers {key.get_name()} {fingerprint(key.asbytes())}, "
            f"but {first.file} line {first.line} lists a {first.key_type} key for it",
            hint=f"first, the likelier cause: {name} may now be another machine's address (a stopped CT's address "
                 "handed to another, or a Proxmox CT's lookup orch remembered that is out of date; for a CT target "
                 "orch asks the API for its address again on the next command, so run it again, and "
                 "[proxmox] cache_ttl = 0 always asks): check which machine holds it; only if the host was really "
                 "reinstalled, remove "
                 f"that line (ssh-keygen -R '{name}' -f {first.file}) and verify the new key; otherwise someone may "
                 "be intercepting the connection (--trust-new-host never overrides a changed key)")

    def _record(self, name: str, key: Any) -> None:
        folder = os.path.dirname(self.trust_file) or "."
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(self.trust_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(f"{name} {key.get_name()} {key.get_base64()}\n")
        os.chmod(self.trust_file, 0o600)
