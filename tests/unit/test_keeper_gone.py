"""A keeper that dies between a command's connect and its request: nothing ran there, so the command goes on on
its own connection. Before, the request's write raised the broken pipe itself, which click turns into a silent
exit 1 (seen once in the chaos loop: a deploy that said nothing at all)."""

from __future__ import annotations

import socket

from orchestrator.reach.keeper import client
from orchestrator.reach.transport.local import LocalTransport


def test_a_keeper_gone_before_it_read_the_request_sends_the_command_on_the_own_connection(monkeypatch):
    connected = []

    def gone_keeper(_persist):
        ours, theirs = socket.socketpair()
        theirs.close()  # killed just after the connect: the request's write meets a broken pipe
        connected.append(ours)
        return ours

    monkeypatch.setattr(client, "keeper", gone_keeper)
    kept = client.KeptTransport({"host": "ct200"}, command_timeout=30, persist=60, direct=LocalTransport)
    try:
        result = kept.run(["echo", "ran here"])
    finally:
        kept.close()
    assert (result.exit_code, result.stdout) == (0, b"ran here\n")
    assert len(connected) == 2  # it tried the keeper again (one exiting as it connected), then went on directly
