"""The resident agent (``agent.pyz serve``) as the keeper runs it: a real process, request after request on
one stdin, each answer in chunks ended by ``0\\n``; the same envelopes a one-shot call prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from orchestrator.agent.layout import Layout
from orchestrator.agent.protocol import MARK_FRAME, unframe
from orchestrator.reach.agent_client import AgentClient, Frames
from orchestrator.reach.transport.local import LocalTransport


def request(root: str, ops: list, payload: bytes = b"") -> bytes:
    head = {"v": 1, "root": root, "ops": ops, "lock": None, "what": "test", "payload": len(payload)}
    return json.dumps(head).encode() + b"\n" + payload


def answer(stream) -> bytes:
    """One chunked answer from ``stream``: the bytes it carries."""
    out = bytearray()
    while True:
        size = int(stream.readline(), 16)
        if size == 0:
            return bytes(out)
        out += stream.read(size)


def start(tmp_path):
    root = str(tmp_path / "root")
    client = AgentClient(LocalTransport(), root, sys.executable)
    client.one("hello")  # unpacks the agent zip into the root
    proc = subprocess.Popen([sys.executable, client.agent_path, "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return root, client, proc


def says_stale_and_runs_nothing(root: str, proc, tmp_path) -> None:
    """The next request (one that would leave a file behind) is answered ``stale``, runs nothing, and the resident
    exits."""
    marker = tmp_path / "ran"
    proc.stdin.write(request(root, [{"op": "shell", "args": {"argv": ["touch", str(marker)]}}]))
    proc.stdin.flush()
    assert proc.stdout.readline() == b"stale\n"
    assert proc.wait(timeout=10) == 0
    assert not marker.exists()  # nothing ran


def test_requests_one_after_another_with_tricky_log_bytes_and_a_bad_request(tmp_path):
    root, client, proc = start(tmp_path)
    run_dir = Layout(root).run_dir(3, "abcdef123456")
    os.makedirs(run_dir)
    tricky = b"step 1\n0\n@@END@@\n\n@@ORCH-ENVELOPE@@{}@@END@@\n" + MARK_FRAME + b"{\"n\": 99}\n" + b"tail\n"
    with open(os.path.join(run_dir, "train.log"), "wb") as fh:
        fh.write(tricky)
    try:
        proc.stdin.write(request(root, [{"op": "hello", "args": {}}]))
        proc.stdin.flush()
        first = unframe(answer(proc.stdout))
        assert first["results"][0]["ok"] and first["results"][0]["value"]["agent"] == client.agent_path

        proc.stdin.write(b"this is not json\n")
        proc.stdin.flush()
        bad = unframe(answer(proc.stdout))
        assert bad["fatal"]["kind"] == "input" and "not JSON" in bad["fatal"]["message"]

        key = {"exp_id": 3, "registry": "abcdef123456"}
        proc.stdin.write(request(root, [{"op": "log_read", "args": {**key, "offset": 0}}]))
        proc.stdin.flush()
        identity = unframe(answer(proc.stdout))["results"][0]["value"]["identity"]
        args = {**key, "offset": 0, "identity": identity, "heartbeat": 0.2}
        proc.stdin.write(request(root, [{"op": "log_stream", "args": args}]))
        proc.stdin.flush()
        frames: list[bytes] = []
        parser = Frames(lambda header, data: frames.append(data))
        parser.feed(answer(proc.stdout))
        assert b"".join(frames) == tricky  # the log's bytes, whatever they look like, and the envelope after
        assert unframe(parser.leftover())["results"][0]["ok"]

        proc.stdin.write(request(root, [{"op": "hello", "args": {}}], payload=b"x" * 5000))
        proc.stdin.flush()  # a payload no op reads is skipped: the next request still parses
        assert unframe(answer(proc.stdout))["results"][0]["ok"]
        proc.stdin.write(request(root, [{"op": "hello", "args": {}}]))
        proc.stdin.flush()
        assert unframe(answer(proc.stdout))["results"][0]["ok"]
    finally:
        proc.stdin.close()
    assert proc.wait(timeout=10) == 0  # the end of stdin ends it
    assert proc.stdout.read() == b""


def test_a_child_printing_on_stdout_does_not_corrupt_the_answers(tmp_path):
    root, _client, proc = start(tmp_path)
    shell = {"op": "shell", "args": {"argv": ["sh", "-c", "echo noise; echo more >&2; echo 0; exec 1>&-"]}}
    try:
        proc.stdin.write(request(root, [shell, {"op": "hello", "args": {}}]))
        proc.stdin.flush()
        envelope = unframe(answer(proc.stdout))
        assert [r["ok"] for r in envelope["results"]] == [True, True]
        assert envelope["results"][0]["value"]["stdout"] == "noise\n0\n"
    finally:
        proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def test_a_resident_whose_files_were_replaced_runs_nothing_and_says_stale(tmp_path):
    """orch's root replaced under a live resident (a new /workspace): it must not run a request with code it can
    no longer import, but answer ``stale`` (the keeper then runs the request one-shot) and exit."""
    import shutil

    root, client, proc = start(tmp_path)
    try:
        proc.stdin.write(request(root, [{"op": "hello", "args": {}}]))
        proc.stdin.flush()
        assert unframe(answer(proc.stdout))["results"][0]["ok"]
        unpacked = client.agent_path[:-4] + ".d"
        shutil.copytree(unpacked, unpacked + ".new")
        shutil.rmtree(unpacked)
        os.rename(unpacked + ".new", unpacked)  # same path and content, other files
        says_stale_and_runs_nothing(root, proc, tmp_path)
    finally:
        proc.kill()


def test_a_resident_whose_root_became_writable_by_others_runs_nothing_and_says_stale(tmp_path):
    """orch's root made writable by others under a live resident: the request goes one-shot, whose bootstrap
    refuses it (StrictModes), never to the resident that was started while the root was safe."""
    root, client, proc = start(tmp_path)
    try:
        proc.stdin.write(request(root, [{"op": "hello", "args": {}}]))
        proc.stdin.flush()
        assert unframe(answer(proc.stdout))["results"][0]["ok"]
        os.chmod(root, 0o777)
        says_stale_and_runs_nothing(root, proc, tmp_path)
        refused = subprocess.run([sys.executable, client.agent_path], input=request(root, []), capture_output=True)
        assert refused.returncode == 6 and b"it is writable by other users" in refused.stdout, refused
    finally:
        proc.kill()


def test_a_resident_loads_what_its_requests_import_late_before_they_come():
    """What a launch, a stop and a status import as they run (subprocess, shutil, socket) is loaded
    while a resident waits: the agent a keeper readies answers the next command as fast as a used one."""
    import subprocess
    import sys

    probe = ("import sys; from orchestrator.agent.serving import serve; "
             "assert not [m for m in serve.PRELOAD if m in sys.modules]; serve._preload(); "
             "print(sorted(m for m in serve.PRELOAD if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    from orchestrator.agent.serving import serve

    assert out.strip() == str(sorted(serve.PRELOAD))


def test_a_resident_whose_login_environment_changed_runs_nothing_and_says_stale(tmp_path):
    """A line added to the login's startup files (here ``~/.bashrc``, edited in place) under a live resident: the
    runs it would start begin from its environment, older than a fresh login's. It answers ``stale`` (the keeper
    runs the request one-shot, on a fresh login) and exits; until then it serves as before."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export A=1\n")
    root = str(tmp_path / "root")
    client = AgentClient(LocalTransport(), root, sys.executable)
    client.one("hello")
    proc = subprocess.Popen([sys.executable, client.agent_path, "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "HOME": str(home)})
    try:
        for _ in range(2):  # nothing changed: served
            proc.stdin.write(request(root, [{"op": "hello", "args": {}}]))
            proc.stdin.flush()
            assert unframe(answer(proc.stdout))["results"][0]["ok"]
        with open(home / ".bashrc", "a") as fh:
            fh.write("export FRESH=1\n")
        says_stale_and_runs_nothing(root, proc, tmp_path)
    finally:
        proc.kill()


def test_the_login_files_are_the_targets_and_the_logins_own():
    from orchestrator.agent.serving.serve import login_files

    files = login_files("/home/ml")
    assert "/etc/bash.bashrc" in files and "/home/ml/.bashrc" in files and "/home/ml/.ssh/environment" in files
    assert all(not f.startswith("~") for f in files)
    assert "/etc/bash.bashrc" in login_files(None) and not any(f.startswith("/home") for f in login_files(None))
