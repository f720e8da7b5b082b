"""A resident agent asks each tmux binary its version once: a deploy's preflight and doctor run no ``tmux -V``
after the first, until the binary is replaced."""

from __future__ import annotations

import os
import shutil

from orchestrator.agent.machine.system import tmux_version


def test_each_tmux_binary_is_asked_once_until_it_changes(tmp_path):
    asked = tmp_path / "asked"
    tmux = tmp_path / "tmux"
    tmux.write_text(f"#!/bin/sh\necho x >> {asked}\necho 'tmux 3.3a'\n")
    tmux.chmod(0o755)
    assert tmux_version(str(tmux)) == tmux_version(str(tmux)) == "tmux 3.3a"
    assert asked.read_text().count("x") == 1
    tmux.write_text(f"#!/bin/sh\necho x >> {asked}\necho 'tmux 3.4'\n")  # an upgrade
    st = tmux.stat()
    os.utime(tmux, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert tmux_version(str(tmux)) == "tmux 3.4"
    assert asked.read_text().count("x") == 2
    real = shutil.which("tmux")
    assert real and tmux_version(real).startswith("tmux ")
    assert tmux_version(str(tmp_path / "gone")) == "?"
