"""The controller's one atomic write (the old file survives a write that fails half-way), and its one file hasher."""

import os
import stat
import subprocess
import sys

import pytest

from orchestrator.files import atomic_write

# A real failure in the middle of the write: the file size limit (RLIMIT_FSIZE) makes the write()
# of the second kilobyte fail with EFBIG, as a full disk would with ENOSPC.
CHILD = """
import resource, signal, sys
from orchestrator.files import atomic_write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
try:
    atomic_write(sys.argv[1], b"new" * 4096)
except OSError as exc:
    print(exc.errno)
    sys.exit(3)
"""


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "current-target.json"
    target.write_text('{"ct": 200}\n')
    proc = subprocess.run([sys.executable, "-c", CHILD, str(target)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert target.read_text() == '{"ct": 200}\n'
    assert os.listdir(tmp_path) == ["current-target.json"]


def test_replaces_the_content_and_keeps_a_private_mode(tmp_path):
    target = tmp_path / "cache.json"
    target.write_text("old")
    atomic_write(target, "new ü")
    assert target.read_text(encoding="utf-8") == "new ü"
    secret = tmp_path / "private.json"
    atomic_write(secret, b"{}", mode=0o600)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["cache.json", "private.json"]


def test_a_missing_folder_raises_and_creates_nothing(tmp_path):
    try:
        atomic_write(tmp_path / "absent" / "f.json", "x")
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("a write into a missing folder must fail")
    assert os.listdir(tmp_path) == []


def test_a_cache_is_replaced_atomically_without_the_disk_flushes(tmp_path, monkeypatch):
    flushed = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (flushed.append(fd), real(fd)))
    target = tmp_path / "hashes.json"
    atomic_write(target, "{}")
    assert len(flushed) == 2  # the file, then its folder: the rename survives a power cut
    flushed.clear()
    atomic_write(target, '{"a": 1}', durable=False)
    assert target.read_text() == '{"a": 1}' and flushed == []
    assert os.listdir(tmp_path) == ["hashes.json"]


def test_sha256_file_hashes_all_or_the_first_size_bytes_and_says_when_fewer_are_there(tmp_path):
    import hashlib

    from orchestrator.files import READ, sha256_file

    data = os.urandom(2 * READ + 123)  # more than one read, and a last read that is not whole
    path = tmp_path / "blob"
    path.write_bytes(data)
    told: list[int] = []
    assert sha256_file(path, advance=told.append) == hashlib.sha256(data).hexdigest()
    assert told == [READ, READ, 123]
    assert sha256_file(path, size=READ + 5) == hashlib.sha256(data[:READ + 5]).hexdigest()
    assert sha256_file(path, size=0) == hashlib.sha256(b"").hexdigest()
    with pytest.raises(EOFError):
        sha256_file(path, size=len(data) + 1)
    with pytest.raises(FileNotFoundError):
        sha256_file(tmp_path / "missing")
