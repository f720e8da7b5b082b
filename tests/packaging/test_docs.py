"""The docs cannot rot: the site builds with ``mkdocs build --strict`` (a broken link or anchor fails it), its
generated references name every command and every orch.toml key, and the tutorial's commands run as written, in
an empty folder, on the built-in local target.

The tutorial marks what the test does with its blocks: ``<!-- file: NAME -->`` before a block writes it to
NAME, ``<!-- run -->`` before a ``sh`` block runs it with bash (``-e``: every line must succeed), in order.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, tmux_socket

TUTORIAL = REPO / "docs" / "tutorial.md"
BLOCK = re.compile(r"<!-- (run|file: (?P<name>[^ ]+)) -->\n```(?P<lang>\w*)\n(?P<body>.*?)\n```", re.S)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _text(page: Path) -> str:
    """A built page's text, tags dropped and entities decoded, so `<code>orch deploy</code>` reads orch deploy."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _typer_commands() -> list[str]:
    """Every command as typer registered it (not through the click tree the reference walks)."""
    import typer

    from orchestrator.cli.main import app

    def name(info) -> str:
        return info.name or info.callback.__name__.replace("_", "-")

    paths = [f"orch {name(c)}" for c in app.registered_commands if not c.hidden]
    for group in app.registered_groups:
        sub = group.typer_instance
        assert isinstance(sub, typer.Typer)
        paths.append(f"orch {group.name}")
        paths += [f"orch {group.name} {name(c)}" for c in sub.registered_commands if not c.hidden]
    return paths


def _settings_keys() -> list[str]:
    """Every orch.toml key, walked from the pydantic models themselves."""
    from pydantic import BaseModel

    from orchestrator.config import Settings

    def models(annotation):
        return [a for a in (annotation, *getattr(annotation, "__args__", ())) if isinstance(a, type)
                and issubclass(a, BaseModel)]

    def walk(model, prefix: str):
        for key, field in model.model_fields.items():
            inner = models(field.annotation)
            if getattr(field.annotation, "__origin__", None) is dict and inner:
                yield from walk(inner[0], f"{prefix}{key}.NAME.")
            elif inner:
                yield from walk(inner[0], f"{prefix}{key}.")
            else:
                yield prefix + key

    return list(walk(Settings, ""))


def test_the_site_builds_strictly_and_its_references_name_every_command_and_key(site):
    commands = _text(site / "reference" / "commands" / "index.html")
    missing = [path for path in _typer_commands() if path not in commands]
    assert not missing, f"the command reference lacks {missing}"
    assert "orch experiments compare" in commands and "--clean-checkpoints" in commands  # options too
    config = _text(site / "reference" / "config" / "index.html")
    keys = _settings_keys()
    assert {"run.stop_timeout", "targets.NAME.ct", "proxmox.node_ssh.user", "default_target"} <= set(keys)
    missing = [key for key in keys if key not in config]
    assert not missing, f"the orch.toml reference lacks {missing}"
    # the architecture page is ARCHITECTURE.md itself, not a copy that can drift
    first = (REPO / "ARCHITECTURE.md").read_text().splitlines()[2]
    assert " ".join(first.split()[:8]) in " ".join(_text(site / "internals" / "architecture" / "index.html").split())


def test_every_key_in_the_reference_says_what_it_means():
    sys.path.insert(0, str(REPO / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(REPO / "docs"))
    meanings = hooks.config_meanings()
    assert sorted(meanings) == sorted(_settings_keys())
    assert not [key for key, text in meanings.items() if not text], "keys without a meaning in the reference"
    stale = sorted(set(hooks.MEANINGS) - set(meanings))
    assert not stale, f"docs/hooks.py MEANINGS names keys orch.toml no longer has: {stale}"


def test_the_tutorial_runs_as_written(tmp_path):
    blocks = list(BLOCK.finditer(TUTORIAL.read_text(encoding="utf-8")))
    runs = [b for b in blocks if b.group(1) == "run"]
    assert len(runs) >= 5 and any(b.group("name") for b in blocks)
    home, folder, bin_dir = tmp_path / "home", tmp_path / "myproject", tmp_path / "bin"
    for path in (home, folder, bin_dir):
        path.mkdir()
    # `orch` as a user types it, from this checkout's code
    (bin_dir / "orch").write_text(f"#!/bin/sh\nexec {sys.executable} -m orchestrator.cli.main \"$@\"\n")
    (bin_dir / "orch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "XDG_DATA", "XDG_CONFIG"))}
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(REPO), ORCH_WARM="0")
    root = home / ".local" / "share" / "orch" / "local"  # the built-in local target's root under this HOME
    said = []
    try:
        for block in blocks:
            if block.group("name"):
                (folder / block.group("name")).write_text(block.group("body") + "\n")
                continue
            assert block.group("lang") == "sh", block.group(0)
            proc = subprocess.run(["bash", "-e", "-c", block.group("body")], cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=180)
            said.append(f"$ {block.group('body')}\n{proc.stdout}{proc.stderr}")
            assert proc.returncode == 0, "\n".join(said)
    finally:
        subprocess.run(["tmux", "-L", tmux_socket(str(root)), "kill-server"], capture_output=True)
    listing = subprocess.run(["orch", "experiments", "list", "--json"], cwd=folder, env=env, capture_output=True,
                             text=True, timeout=60)
    rows = json.loads(listing.stdout)
    assert [row["id"] for row in sorted(rows, key=lambda r: r["id"])] == [1, 2], listing.stdout
    second = next(row for row in rows if row["id"] == 2)
    assert second["parent"] == 1 and second["checkpoints_action"] == "moved", second
    assert any((root / "checkpoints").rglob("step-*.json")), "the tutorial's run left no checkpoint"


def test_the_readme_is_a_guide_whose_links_lead_somewhere():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local and not [link for link in local if not (REPO / link).exists()]
    head = text[:text.index("## Quickstart")]
    assert "pipx install ." in head and "pip install dist/orch-" in head  # install for one's own projects, first
