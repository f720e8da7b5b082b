"""The architecture as a test: which part of orch may import which (ARCHITECTURE.md says why).

Every import counts, the lazy ones inside functions too: a circle through a lazy import is still a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "orchestrator"

# Lowest first: a part may import only parts below it (and itself). The agent and batching ship to the targets
# alone, so they sit beside everything else and import only themselves (and batching, for the agent).
LAYERS = [
    {"errors"},
    {"config", "secrets", "signals", "files", "sockets", "after_answer"},
    {"reach", "warm.client"},  # the warm client only finds and talks to the warm process
    {"records"},
    {"watch"},
    {"checkpoints"},
    {"launch"},
    {"ui"},  # orch ui's server: beside the CLI (it reads what the CLI reads and acts through the CLI's commands)
    {"cli"},
    {"warm"},
    {"main"},
    {"__main__"},  # python -m orchestrator: the orch script run here
]
SHIPPED = {"agent": {"agent", "batching"}, "batching": {"batching"}}
PURE = [*(p.relative_to(PKG).as_posix() for p in (PKG / "batching").glob("*.py") if p.name != "lengths.py"),
        "watch/logparse.py", "watch/reading_key.py", "watch/metrics.py", "agent/metrics", "watch/doctor_checks.py", "watch/job_progress.py",
        "launch/command.py",
        "launch/distributed.py", "launch/limits.py", "launch/space.py", "launch/search_view.py", "launch/pull_plan.py", "records/end_reason.py",
        "records/job_settle.py", "records/launch_journal.py"]
IO = {"os", "io", "subprocess", "socket", "sqlite3", "shutil", "pathlib", "tempfile", "fcntl", "select",
      "paramiko", "requests", "proxmoxer", "typer", "rich", "pydantic"}
SCREEN = {"rich", "typer"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imported(path: Path) -> set[str]:
    """Every orchestrator module and outside package that ``path`` imports, anywhere in its code."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return found | table_imports(path)


def table_imports(path: Path) -> set[str]:
    """The modules the agent's op table names (``"<module>.<function>"``, imported as a call looks its op up): imports
    as much as its import statements are."""
    if path != PKG / "agent" / "__main__.py":
        return set()
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if getattr(target, "id", None) == "OP_TABLE":
            return {f"orchestrator.agent.{entry.elts[0].value.rsplit('.', 1)[0]}" for entry in node.value.values
                    if isinstance(entry.elts[0], ast.Constant)}
    raise AssertionError("agent/__main__.py has no OP_TABLE")


def part(module: str) -> str:
    """The part a module belongs to: the finest name placed in LAYERS (``warm.client``), else its subpackage,
    else its own name at the top level."""
    names = module.split(".")[1:]
    placed = set().union(*LAYERS)
    for n in (2, 1):
        if ".".join(names[:n]) in placed:
            return ".".join(names[:n])
    return names[0] if names else module


GRAPH = {name: {m for m in imported(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def test_every_part_is_placed():
    placed = set().union(*LAYERS) | set(SHIPPED)
    parts = {part(m) for m in MODULES if m != "orchestrator"}
    assert parts <= placed, f"not in LAYERS or SHIPPED: {sorted(parts - placed)}"


def test_parts_import_only_what_lies_below_them():
    level = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    wrong = []
    for name, targets in GRAPH.items():
        if name == "orchestrator":
            continue
        mine = part(name)
        for target in targets:
            theirs = part(target)
            if target == "orchestrator" or theirs == mine:
                continue
            if mine in SHIPPED:
                ok = theirs in SHIPPED[mine]
            elif theirs in SHIPPED:
                ok = True  # the controller reads the agent's protocol and the batching library
            else:
                ok = level[theirs] < level[mine]
            if not ok:
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_circle():
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def _paths(spec: str) -> list[Path]:
    target = PKG / spec
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


def test_pure_code_does_no_io():
    for spec in PURE:
        for path in _paths(spec):
            roots = {m.split(".")[0] for m in imported(path)}
            assert not roots & IO, f"{path.relative_to(PKG)} imports {sorted(roots & IO)}"


def test_below_the_cli_nothing_knows_the_screen():
    for name, path in MODULES.items():
        if part(name) in {"cli", "warm", "warm.client", "main"}:
            continue
        roots = {m.split(".")[0] for m in imported(path)}
        assert not roots & SCREEN, f"{name} imports {sorted(roots & SCREEN)}"


def test_the_connection_keeper_knows_only_how_to_reach():
    for name, targets in GRAPH.items():
        if name.startswith("orchestrator.reach.keeper"):
            bad = {t for t in targets if part(t) in {"records", "launch", "cli", "warm", "watch", "checkpoints"}}
            assert not bad, f"{name} imports {sorted(bad)}"


AGENT = PKG / "agent"
# The agent's rooms: its subpackages. Each lists in its __init__'s __all__ the modules the rest of the agent may
# import; the agent's own modules beside them (the helpers every room uses) import no room, except its entry points.
ROOMS = sorted(p.name for p in AGENT.iterdir() if (p / "__init__.py").is_file())
ENTRY = {"orchestrator.agent.__main__", "orchestrator.agent.bootstrap"}


def public(room: str) -> set[str]:
    """The modules a room lets the rest of the agent import: its ``__all__``."""
    for node in ast.parse((AGENT / room / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def room_of(module: str) -> str | None:
    """``run`` for ``orchestrator.agent.run.runs``; None for a module outside the agent's rooms."""
    names = module.split(".")
    return names[2] if names[:2] == ["orchestrator", "agent"] and len(names) > 2 and names[2] in ROOMS else None


def test_the_agent_has_rooms_and_each_names_its_public_modules():
    assert len(ROOMS) >= 6, ROOMS
    for room in ROOMS:
        mine = {p.stem for p in (AGENT / room).glob("*.py") if p.name != "__init__.py"}
        assert public(room), f"agent/{room}/__init__.py lists no public module in __all__"
        assert public(room) <= mine, f"agent/{room}'s __all__ names what it lacks: {sorted(public(room) - mine)}"
        assert not list((AGENT / room).glob("*/__init__.py")), f"agent/{room} has rooms of its own: one level only"


def test_agent_rooms_import_only_each_others_public_modules():
    wrong = []
    for name, targets in GRAPH.items():
        if not name.startswith("orchestrator.agent"):
            continue
        mine = room_of(name)
        for target in targets:
            theirs = room_of(target)
            if theirs is None or theirs == mine or target == f"orchestrator.agent.{theirs}":
                continue
            if mine is None and name not in ENTRY and name != "orchestrator.agent":
                wrong.append(f"{name} -> {target} (the helpers beside the rooms import no room)")
            elif target.split(".")[3] not in public(theirs):
                wrong.append(f"{name} -> {target} (not in agent/{theirs}/__init__.py's __all__)")
    assert not wrong, "imports into another agent room's own modules:\n" + "\n".join(sorted(wrong))


def test_the_agents_op_table_names_modules_and_functions_that_exist():
    from orchestrator.agent.__main__ import OPS

    named = table_imports(PKG / "agent" / "__main__.py")
    assert "orchestrator.agent.run.runs" in named and "orchestrator.agent.ckpt.checkpoints" in named
    assert named <= set(MODULES), sorted(named - set(MODULES))
    for op in OPS:
        function, wants_payload = OPS[op]
        assert callable(function) and isinstance(wants_payload, bool), op


def test_the_architecture_names_every_agent_room():
    text = (PKG.parent / "ARCHITECTURE.md").read_text()
    missing = [room for room in ROOMS if f"agent/{room}/" not in text]
    assert not missing, f"ARCHITECTURE.md does not describe agent rooms: {missing}"


def test_at_most_ten_modules_at_the_top():
    top = sorted(p.name for p in PKG.glob("*.py") if p.name != "__main__.py")  # python -m's hook, not a module
    assert len(top) <= 10, top
