"""A broken pipe inside a command: click ends any ``EPIPE`` with exit 1 and not a word, which is right when the
reader of orch's output went away (``orch experiments list | head -0``) and wrong when a pipe or socket of orch's
own broke (a keeper killed under a request, say): that one says what happened, as every error does."""

from __future__ import annotations

import subprocess
import sys

BREAKS = """
import sys
from orchestrator.records import listing
def broke(*_a, **_k):
    raise BrokenPipeError(32, "Broken pipe")
listing.rows = broke
from orchestrator.cli.main import run_as_main
sys.argv = ["orch", "experiments", "list"]
run_as_main()
"""


def test_a_pipe_of_orchs_own_that_breaks_is_an_error_with_a_hint(project):
    done = subprocess.run([sys.executable, "-c", BREAKS], cwd=project.path, capture_output=True, text=True,
                          timeout=60)
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr
    assert [line for line in lines if line.startswith("error: ")] == [
        "error: a connection orch was writing to closed ([Errno 32] Broken pipe)"], done.stderr
    assert any(line.startswith("hint: ") for line in lines), done.stderr
    assert "Traceback" not in done.stderr


def test_output_whose_reader_went_away_ends_quietly(project):
    reader = subprocess.Popen([sys.executable, "-c", BREAKS], cwd=project.path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    assert reader.stdout is not None
    reader.stdout.close()  # `| head -0`: nobody reads what it prints
    _out, err = reader.communicate(timeout=60)
    assert reader.returncode == 1
    assert b"error:" not in err and b"Traceback" not in err, err
