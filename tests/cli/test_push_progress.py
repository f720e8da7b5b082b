"""Progress of big pushes: a bar on a terminal's stderr, nothing in --json or a pipe."""

from __future__ import annotations

import os
import sys

from tests.conftest import run_on_pty


def orch(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli.main", *args]


def with_data(project, tag: str) -> None:
    data = project.path / "data"
    data.mkdir(exist_ok=True)
    for i in range(3):
        (data / f"shard{i}.bin").write_bytes(tag.encode() + os.urandom(4 << 20))
    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(text.replace('sources = ["train.py"]', 'sources = ["train.py", "data"]'))


def test_a_big_push_shows_a_bar_on_a_terminal_only(project):
    project.configure(steps=100000, sleep=0.01)
    with_data(project, "one")
    code, screen = run_on_pty(orch("deploy"), project.path, {})
    assert code == 0, screen
    assert "pushing" in screen and "4/4 files" in screen and "MB" in screen  # train.py and three shards
    assert "revision: 4 of 4 file(s) sent" in screen

    with_data(project, "two")  # new content: the shards are sent again
    code, screen = run_on_pty(orch("deploy", "--json"), project.path, {})
    assert code == 0, screen
    assert "pushing" not in screen and '"missing": 3' in screen

    with_data(project, "three")
    piped = project.run("deploy")
    assert piped.returncode == 0, piped.stderr
    assert "pushing" not in piped.stderr and "revision: 3 of 4 file(s) sent" in piped.stderr
    assert project.run("stop").returncode == 0
