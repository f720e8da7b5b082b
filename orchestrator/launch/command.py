"""Pure: the project's command as the target runs it, a shell line (a string) or an argument list.

A string is a shell line, as in a Procfile: ``$VAR`` from the run's environment, quotes, ``&&``, redirects.
It runs as ``/bin/sh -c LINE``; a line that is one simple command runs as ``/bin/sh -c 'exec LINE'``, so the
shell becomes the program and a graceful stop's SIGINT reaches it directly. A list runs as it is, no shell::

    exec_argv("python3 train.py --out=$ORCH_CHECKPOINT_DIR")  # ["/bin/sh", "-c", "exec python3 train.py --out=..."]
    exec_argv("mkdir -p $D && python3 train.py > x.log")      # ["/bin/sh", "-c", "mkdir -p $D && ..."]
    exec_argv(["python3", "train.py", "$HOME"])                # as it is: "$HOME" stays literal
"""

from __future__ import annotations

import re
import shlex

from ..errors import InputError

SHELL = "/bin/sh"
# words that open a compound command: ``exec`` before them would run a program of that name
RESERVED = frozenset("if then else elif fi case esac for while until do done { } ! [[ ]] function select time".split())
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
OPERATOR_CHARS = set(";&|<>()")


def words(line: str) -> list[str]:
    """The line's words as written (quotes and ``$VAR`` kept), split at unquoted blanks.

    ``python3 a.py --x="$D y"`` -> ``["python3", "a.py", '--x="$D y"']``.
    """
    out, word, quote, i = [], "", "", 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\" and i + 1 < len(line):
            word += c
            i += 1
            c = line[i]
        elif quote == '"':
            quote = "" if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c in " \t":
            if word:
                out.append(word)
            word = ""
            i += 1
            continue
        word += c
        i += 1
    if quote:
        raise ValueError(f"no closing {quote}")
    return out + ([word] if word else [])


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    return list(lexer)


def check(command: str | list[str], key: str = "[project] command") -> None:
    """A line the shell can parse the quoting of, and not empty; a list of at least one word."""
    if isinstance(command, list):
        if not command or not command[0]:
            raise InputError(f"{key} is empty", hint="set [project] command in orch.toml")
        return
    try:
        tokens = _tokens(command)
    except ValueError as exc:
        raise InputError(f"{key} {command!r:.200} is not a shell line orch can read: {exc}",
                         hint="fix the quoting, or give command as a list of strings") from None
    if not tokens:
        raise InputError(f"{key} is empty", hint="set [project] command in orch.toml")


def simple(line: str) -> bool:
    """One simple command (words, ``$VAR``s, leading ``NAME=value``s): no operator, redirect, newline or
    compound word, so that ``exec`` can replace the shell with it."""
    if "\n" in line or "\r" in line:
        return False
    try:
        tokens = _tokens(line)
    except ValueError:
        return False
    if any(t and set(t) <= OPERATOR_CHARS for t in tokens):
        return False
    head = [w for w in tokens if not ASSIGNMENT.match(w)][:1]
    return bool(head) and head[0] not in RESERVED and head[0] != "exec"


def exec_line(line: str) -> str:
    """The line with ``exec`` in front of its program (after any ``NAME=value`` words), if it is simple."""
    if not simple(line):
        return line
    raw = words(line)
    n = next(i for i, w in enumerate(raw) if not ASSIGNMENT.match(w))
    return " ".join([*raw[:n], "exec", *raw[n:]])


def exec_argv(command: str | list[str]) -> list[str]:
    """What the target's supervisor starts (no shell of its own)."""
    if isinstance(command, list):
        return list(command)
    return [SHELL, "-c", exec_line(command.strip())]


def how_it_runs(command: str | list[str]) -> str:
    """For the dry run: ``sh -c '...'`` for a line, the argument list (no shell) for a list."""
    if isinstance(command, list):
        return f"{shlex.join(command)} (an argument list: no shell)"
    return f"{shlex.join(exec_argv(command))} (a shell line: $VARs from the run's environment)"


def references(line: str, names: list[str]) -> list[str]:
    """Which of ``names`` the line expands (``$NAME``, ``${NAME...}``)."""
    return [n for n in names if re.search(r"\$(\{)?" + re.escape(n) + r"(?![A-Za-z0-9_])", line)]


PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
LAUNCHERS = ("torchrun", "deepspeed")  # then options, then the script: ``torchrun --nproc_per_node 2 train.py``
UNSURE = set("$`*?[~{") | {"\\"}  # a word a shell expands: what it names is only known on the target


def runs_file(command: str | list[str]) -> tuple[str, str] | None:
    """What the command surely runs from its work folder: ``("script", "projects/x/run.py")`` or
    ``("module", "pkg.train")``; None where it is not sure (a compound line, a ``cd``, an absolute path, a ``$VAR``,
    ``-c``), so that only a command that cannot start is ever refused::

        runs_file("python3 -u train.py --lr 3e-4")          # ("script", "train.py")
        runs_file("torchrun --nproc_per_node 2 ddp.py")     # ("script", "ddp.py")
        runs_file("python3 -m mingpt.train")                # ("module", "mingpt.train")
        runs_file("cd sub && python3 train.py")             # None
    """
    if isinstance(command, str):
        if not simple(command):
            return None
        try:
            tokens, raw = _tokens(command), words(command)
        except ValueError:
            return None
        if len(tokens) != len(raw) or any(UNSURE & set(w) for w in raw):
            return None
        tokens = tokens[next(i for i, w in enumerate(tokens) if not ASSIGNMENT.match(w)):]
    else:
        tokens = list(command)
    if not tokens:
        return None
    prog, args = tokens[0].rsplit("/", 1)[-1], tokens[1:]
    found: tuple[str, str] | None = None
    if PYTHON.fullmatch(prog):
        found = _python_target(args)
    elif prog in LAUNCHERS or (prog == "accelerate" and args[:1] == ["launch"]):
        found = _launched_script(args[1:] if prog == "accelerate" else args)
    elif prog in ("bash", "sh"):
        found = _shell_script(args)
    elif tokens[0].startswith("./"):
        found = ("script", tokens[0])
    if found is None or found[0] == "module":
        return found if found is None or re.fullmatch(r"\w+(\.\w+)*", found[1]) else None
    return _relative(found[1])


def _python_target(args: list[str]) -> tuple[str, str] | None:
    i = 0
    while i < len(args):
        word = args[i]
        if word == "-m" or (word.startswith("-m") and len(word) > 2):
            module = args[i + 1] if word == "-m" and i + 1 < len(args) else word[2:]
            return ("module", module) if module else None
        if word in ("-", "--") or (word.startswith("-") and "c" in word[1:] and not word.startswith("--")):
            return None  # a program from stdin or -c: no file
        if word in ("-X", "-W", "--check-hash-based-pycs"):
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        return "script", word
    return None


def _launched_script(args: list[str]) -> tuple[str, str] | None:
    """The first ``.py`` word of a launcher's arguments (an option's value is a number or a name, not a script);
    a launcher told to run a module or a program is not checked."""
    for word in args:
        if word in ("-m", "--module", "--no-python", "--no_python") or word.startswith(("--module=", "--no-python")):
            return None
        if not word.startswith("-") and word.endswith(".py"):
            return "script", word
    return None


def _shell_script(args: list[str]) -> tuple[str, str] | None:
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith(("-", "+")) and word not in ("-", "--"):
            if "c" in word[1:] or "s" in word[1:]:
                return None  # the commands come from -c or stdin
            i += 2 if word in ("-o", "+o", "-O", "+O") else 1
            continue
        return ("script", word) if word not in ("-", "--") else None
    return None


def _relative(path: str) -> tuple[str, str] | None:
    """The path relative to the work folder, or None when it leaves it (absolute, ``..``)."""
    import posixpath

    if not path or path.startswith("/"):
        return None
    normal = posixpath.normpath(path)
    if normal == "." or normal.startswith("../") or normal == "..":
        return None
    return "script", normal


def missing(found: tuple[str, str], files: set[str], pythonpath: list[str]) -> str | None:
    """The file ``runs_file`` found, when the revision's ``files`` lack it (None: it is there, or a module that
    is not the project's own, which the target's Python may have installed)."""
    kind, name = found
    if kind == "script":
        return None if name in files else name
    parts = name.split(".")
    roots = [""] + [p.strip("/") + "/" for p in pythonpath if p and not p.startswith("/") and ".." not in p]
    for root in roots:
        top = root + parts[0]
        if top + ".py" in files or any(f.startswith(top + "/") for f in files):
            path = root + "/".join(parts)
            wanted = [path + ".py", path + "/__main__.py"]
            return None if any(w in files for w in wanted) else wanted[0]
    return None
