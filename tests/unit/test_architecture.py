"""The import rules that keep the layers honest, checked by walking the source (ast)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "orchestrator"
HEAVY = ("fabric", "paramiko", "proxmoxer", "requests", "libtmux", "numpy", "matplotlib")
OWNERS = {"fabric": {"reach/transport/ssh.py"}, "paramiko": {"reach/transport/ssh.py", "reach/transport/hostkeys.py"}, "proxmoxer": {"reach/proxmox.py"},
          "requests": {"reach/proxmox.py"}, "sqlite3": {"records/experiments.py"}}


def imports(path: Path, top_level_only: bool = False) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(("." * node.level) + (node.module or ""))
    return names


def rel(p: Path) -> str:
    return p.relative_to(PKG).as_posix()


def test_the_agent_imports_only_stdlib_libtmux_and_itself():
    for path in (PKG / "agent").glob("*.py"):
        for name in imports(path):
            assert not name.startswith("..") and not name.startswith("orchestrator") or \
                name.startswith("orchestrator.agent"), f"{rel(path)} imports {name}"
            root = name.lstrip(".").split(".")[0]
            assert root not in ("fabric", "paramiko", "proxmoxer", "requests", "pydantic", "typer", "rich",
                                "numpy"), f"{rel(path)} imports {name}"


def test_batching_and_metrics_do_no_io():
    pure = list((PKG / "batching").glob("*.py")) + [PKG / "watch" / "metrics.py", PKG / "watch" / "logparse.py"]
    for path in pure:
        for name in imports(path):
            root = name.lstrip(".").split(".")[0]
            assert root not in ("subprocess", "socket", "sqlite3", "fabric", "paramiko", "requests", "libtmux",
                                "typer", "pydantic"), f"{rel(path)} imports {name}"
    for path in (PKG / "batching").glob("*.py"):
        for name in imports(path):
            assert not name.startswith("orchestrator") and not name.startswith(".."), f"{rel(path)}: {name}"


def test_each_library_lives_in_its_module():
    for path in PKG.rglob("*.py"):
        for name in imports(path):
            root = name.split(".")[0]
            if root in OWNERS:
                assert rel(path) in OWNERS[root], f"{rel(path)} imports {root}; only {OWNERS[root]} may"


def test_no_heavy_import_at_module_level_on_the_cli_path():
    for path in PKG.rglob("*.py"):
        if rel(path).startswith(("agent/", "batching/")):
            continue
        for name in imports(path, top_level_only=True):
            assert name.split(".")[0] not in HEAVY, f"{rel(path)} imports {name} at module level"


def test_orch_help_loads_no_heavy_module():
    code = ("import sys; from orchestrator.cli.main import app; "
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in %r)))" % (HEAVY + ("pydantic",),))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
