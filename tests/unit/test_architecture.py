"""Which module may import which library, and what stays off the start-up path (the layers: test_layers.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "orchestrator"
HEAVY = ("fabric", "invoke", "paramiko", "proxmoxer", "requests", "numpy", "matplotlib", "mlflow",
         "starlette", "uvicorn", "tensorboard", "optuna")
# paramiko's first import is sshlib's (which holds invoke back); fabric is not used at all
OWNERS = {"fabric": set(), "invoke": {"reach/transport/sshlib.py"},
          "paramiko": {"reach/transport/ssh.py", "reach/transport/hostkeys.py", "reach/transport/sshlib.py"},
          "proxmoxer": {"reach/proxmox.py"},
          "requests": {"reach/proxmox.py"}, "sqlite3": {"records/experiments.py"},
          "mlflow": {"watch/mlflow_export.py"},
          "tensorboard": {"watch/tensorboard_export.py"}, "starlette": {"ui/server.py"}, "uvicorn": {"ui/server.py"},
          "optuna": {"launch/study.py", "agent/queue/search.py"}}  # the agent ships alone: its own


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


# a sweep conducted on its target asks Optuna there: only in its conductor's process, started in a Python that
# was first found to import it (agent/queue/search.py: probe); nothing else of the agent ever imports it
AGENT_OPTIONAL = {"agent/queue/search.py": {"optuna"}}


def test_the_agent_imports_only_the_standard_library_and_itself():
    """A target needs nothing but python3 and tmux: the agent zip carries no library (tmux is asked through its
    command line)."""
    for path in (PKG / "agent").rglob("*.py"):
        depth = len(path.relative_to(PKG / "agent").parts)  # 1 beside the rooms, 2 in one: how far up ".." may go
        for name in imports(path):
            dots = len(name) - len(name.lstrip("."))
            assert dots <= depth and not name.startswith("orchestrator") or \
                name.startswith("orchestrator.agent"), f"{rel(path)} imports {name}"
            root = name.split(".")[0]
            assert name.startswith(".") or root == "orchestrator" or root in sys.stdlib_module_names or \
                root in AGENT_OPTIONAL.get(rel(path), ()), \
                f"{rel(path)} imports {name}, which is not in the standard library"


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


def _private_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: its functions and methods, and what it assigns to ``self._x``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _transport_privates() -> dict[str, str]:
    """Each private attribute or method of a ``Transport`` class in the package, and the module defining it."""
    classes = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (node, rel(path))
    transports = {"Transport"}
    while True:
        more = {name for name, (node, _) in classes.items()
                if any(isinstance(b, ast.Name) and b.id in transports for b in node.bases)} - transports
        if not more:
            break
        transports |= more
    owners = {}
    for name in transports:
        node, where = classes[name]
        for private in _private_names(node):
            owners.setdefault(private, where)
    return owners


def test_no_module_touches_another_modules_transport_private_attributes():
    owners = _transport_privates()
    assert {"_connection", "_timeout", "_conn", "_drop", "_direct"} <= owners.keys()  # the test sees them
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        own = _private_names(tree)
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name)
                                                        and node.value.id in ("self", "cls")):
                name = node.attr
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1 and \
                    isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                name = node.args[1].value
            if name in owners and name not in own and owners[name] != rel(path):
                raise AssertionError(f"{rel(path)}:{node.lineno} touches {name}, private to a transport in "
                                     f"{owners[name]}; use the public Transport surface (reach/transport/base.py)")


def _modules(path: Path) -> list[str]:
    """What a module imports, as absolute names (``from ... import warm`` in reach/keeper/x.py:
    ``orchestrator.warm``)."""
    here = ["orchestrator", *path.relative_to(PKG).parent.parts]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*here[:len(here) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module or ""
            out += [f"{base}.{a.name}" for a in node.names]
    return out


def test_the_keeper_and_the_warm_process_keep_to_their_own_sides():
    forbidden = ("orchestrator.records", "orchestrator.launch", "orchestrator.cli", "orchestrator.warm",
                 "orchestrator.watch", "typer", "rich", "sqlite3")
    for path in (PKG / "reach" / "keeper").glob("*.py"):
        for module in _modules(path):
            assert not module.startswith(forbidden), f"{rel(path)} imports {module}"
        assert "warm" not in path.read_text().lower(), f"{rel(path)} knows about the warm process"
    for path in (PKG / "warm").glob("*.py"):
        for module in _modules(path):
            assert not module.startswith("orchestrator.reach.keeper"), f"{rel(path)} borrows from the keeper: {module}"
    for module in _modules(PKG / "sockets.py"):  # a helper either side may use: the standard library only
        assert module.startswith(("orchestrator.errors.", "__future__.")) or \
            module.split(".")[0] in sys.stdlib_module_names, f"sockets.py imports {module}"
