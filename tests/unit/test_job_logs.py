"""The merged log's writer: whole lines only, each prefixed with its node, never two nodes' bytes in one line."""

import threading

from orchestrator.watch.job_logs import _Lines


def test_partial_lines_wait_for_their_newline_and_are_prefixed():
    out: list[bytes] = []
    lines = _Lines(b"[1] ", out.append, threading.Lock())
    lines(b"step=1 lo")
    assert out == []
    lines(b"ss=2\nstep=2 loss=1\nstep=3")
    assert out == [b"[1] step=1 loss=2\n[1] step=2 loss=1\n"]
    lines.flush()  # the run ended without a final newline: the line is still printed whole
    assert out[-1] == b"[1] step=3\n"
    lines.flush()
    assert len(out) == 2


def test_two_nodes_writing_at_once_never_mix_inside_a_line():
    out = bytearray()
    lock = threading.Lock()
    writers = [_Lines(f"[{r}] ".encode(), out.extend, lock) for r in (0, 1)]

    def write(rank: int) -> None:
        for i in range(2000):
            writers[rank](f"node={rank} i={i}".encode())
            writers[rank](b"\n" if i % 3 else b" tail\n")

    threads = [threading.Thread(target=write, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = bytes(out).splitlines()
    assert len(got) == 4000
    for line in got:
        rank = line[1:2].decode()
        assert line.startswith(f"[{rank}] node={rank} i=".encode()), line


def test_no_prefix_for_one_node():
    out: list[bytes] = []
    lines = _Lines(b"", out.append, threading.Lock())
    lines(b"a\nb\n")
    assert out == [b"a\nb\n"]
