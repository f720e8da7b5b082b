"""The values of ``[project] secrets``: read on the controller, handed to the run, recorded nowhere.

A secret named in orch.toml (``secrets = ["WANDB_API_KEY"]``) is taken from the controller's
environment, else from ``.orch/secrets.env`` (``KEY=VALUE`` lines; the file must be readable by its
owner only). The environment wins, as in the rest of orch's configuration. Only names ever reach
records, output and errors; values travel in the agent's stdin and from the agent to the run through a
pipe (``agent/run/runs.py``).

    >>> looks_secret({"HF_TOKEN": "x", "LR": "1e-3"})
    ['HF_TOKEN']
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Mapping

from .errors import InputError

FILE_NAME = "secrets.env"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SECRET_LOOKING = re.compile(r"(_KEY|_TOKEN|_SECRET)\Z|PASSWORD|PASSWD", re.IGNORECASE)


class SecretValues(dict):
    """name -> value; its repr shows the names only, so a stray log line or traceback leaks nothing."""

    def __repr__(self) -> str:
        return f"SecretValues({sorted(self)})"

    __str__ = __repr__


def looks_secret(env: Mapping[str, str]) -> list[str]:
    """Keys of ``[project] env`` whose names say they hold a secret (``*_KEY``, ``*_TOKEN``, ...)."""
    return [k for k in env if _SECRET_LOOKING.search(k)]


def read_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (blank lines and ``#`` comments skipped, ``export`` and quotes allowed).

    Refused when group or others may read it; errors name the line, never its content.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise InputError(f"cannot read the secrets file {path}: {exc.strerror}",
                         hint="it must be a regular file readable by you (chmod 600)") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"the secrets file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise InputError(f"the secrets file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o})",
                             hint=f"chmod 600 {path}")
        if st.st_uid != os.getuid():
            raise InputError(f"the secrets file {path} belongs to another user (uid {st.st_uid})",
                             hint="it must be your own file with mode 600")
        data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"the secrets file {path} is not UTF-8 text") from None
    return _parse(text, path)


def _parse(text: str, path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not NAME.match(key):
            raise InputError(f"{path}, line {number}: not a KEY=VALUE line",
                             hint="each line is NAME=value (a letter or _ first, then letters, digits, _)")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def collect(names: list[str], state_dir: Path, environ: Mapping[str, str] | None = None) -> SecretValues:
    """The value of every named secret, or one error naming all that are missing and where they were sought."""
    if not names:
        return SecretValues()
    environ = os.environ if environ is None else environ
    path = state_dir / FILE_NAME
    from_file = read_file(path)
    values = SecretValues()
    missing = []
    for name in names:
        if name in environ:
            values[name] = environ[name]
        elif name in from_file:
            values[name] = from_file[name]
        else:
            missing.append(name)
    if missing:
        listed = ", ".join(missing)
        raise InputError(f"secret{'s' if len(missing) > 1 else ''} {listed} named in [project] secrets "
                         f"{'are' if len(missing) > 1 else 'is'} set neither in the environment nor in {path}",
                         hint=f"export {missing[0]}=... before running orch, or add a {missing[0]}=... line to "
                              f"{path} (chmod 600)")
    return values
