"""What the connection keeper tells each request of the connections it opened: the login it readied for the
command that started it is that command's, whichever came first, the readying or the command's first request.

The transport is a stand-in that counts its logins as ``SshTransport`` does (``stats.connections``); the
keeper, its held connections and its accounting are the real ones. Through real SSH: ``test_remote.py`` (a deploy
by CT id says one connection) and ``test_cold_resident.py``.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from orchestrator.reach.keeper import server
from orchestrator.reach.transport import ssh


class CountingTransport:
    def __init__(self, **spec) -> None:
        self.stats = SimpleNamespace(connections=0)
        self.up = False

    def connect(self) -> None:
        if not self.up:
            self.up, self.stats.connections = True, self.stats.connections + 1

    def run(self, argv, **_kw):
        self.connect()
        return SimpleNamespace(exit_code=0, stdout=b"", stderr=b"")

    def close(self) -> None:
        self.up = False


@pytest.fixture
def keeper(monkeypatch, tmp_path):
    monkeypatch.setattr(ssh, "SshTransport", CountingTransport)
    return server.Keeper(tmp_path / "keeper.sock", 60.0, early=True)


def _request(keeper, spec):
    held = keeper._held(spec)
    return keeper._run(held, {"argv": ["true"]}, iter(()), None, threading.Event())[1]


def test_the_login_readied_before_the_first_request_is_told_to_that_request(keeper):
    spec = {"host": "box"}
    keeper.ready(spec, None)  # the keeper logged in before the command's first request came
    assert _request(keeper, spec) == 1
    assert _request(keeper, spec) == 0  # the next requests share it


def test_a_request_that_opens_the_connection_itself_counts_it_once(keeper):
    spec = {"host": "box"}
    assert _request(keeper, spec) == 1
    keeper.ready(spec, None)  # readying what is up already opens nothing
    assert _request(keeper, spec) == 0
    keeper.held[next(iter(keeper.held))].transport.close()  # dropped: the next request logs in again
    assert _request(keeper, spec) == 1


class RefusingTransport(CountingTransport):
    logins = 0

    def connect(self) -> None:
        from orchestrator.errors import TransportError

        for _ in range(3):  # connect_retries = 2
            RefusingTransport.logins += 1
        raise TransportError("127.0.0.1:22 closed the connection while orch logged in")


def test_a_login_the_readying_was_refused_is_told_to_the_commands_request_not_tried_again(monkeypatch, tmp_path):
    from orchestrator.errors import TransportError

    monkeypatch.setattr(ssh, "SshTransport", RefusingTransport)
    keeper = server.Keeper(tmp_path / "keeper.sock", 60.0, early=True)
    spec = {"host": "box"}
    keeper.ready(spec, None)
    with pytest.raises(TransportError, match="closed the connection"):
        _request(keeper, spec)
    assert RefusingTransport.logins == 3  # the readying's tries, not as many again for the request
    with pytest.raises(TransportError):
        _request(keeper, spec)  # a later request logs in again itself
    assert RefusingTransport.logins == 6
