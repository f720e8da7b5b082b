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
