"""pydantic in the ``orch`` command: no plugins looked for, and its plugin loader loaded without ``importlib.metadata``.

pydantic looks for plugins (the ``pydantic`` entry-point group) when it builds its first validator: its loader,
``pydantic.plugin._loader``, imports ``importlib.metadata`` as it loads (``email``, ``zipfile``, ``csv``: ~9 ms)
and then reads the entry points of every installed distribution (3-8 ms, more with more installed), in every
command, for orch's settings, records and playbooks; typer builds its parameters' validators with plugins off
already (``PYDANTIC_DISABLE_PLUGINS``). No plugin has anything to do in orch's own process, so ``install()``, at the
start of a command (before anything imports pydantic), has that loader loaded with a stand-in for
``importlib.metadata`` whose ``entry_points`` answers the loader's one question, which plugins to load, with none.
The stand-in is there only while the loader loads: every other importer gets the real module, and so does the
loader for anything else it asks (the stand-in hands such a request to the real module). A pydantic whose loader
asks otherwise (2.6 walks ``distributions()``) loads its plugins as before, at the cost the stand-in saves here.
The environment is left alone: a run started from this process sees no ``PYDANTIC_DISABLE_PLUGINS`` of orch's.
"""

from __future__ import annotations

import sys
from typing import Any

LOADER = "pydantic.plugin._loader"
GROUP = "pydantic"  # the loader's entry-point group


def install() -> None:
    """From now on, until pydantic's plugin loader has loaded: load it with the stand-in. Nothing to do where it
    has loaded already (a warm process's command), or where ``importlib.metadata`` has (nothing left to save)."""
    if LOADER in sys.modules or "importlib.metadata" in sys.modules:
        return
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder:
    """Finds nothing but the plugin loader, which the other finders find and ``_Loader`` runs; then steps aside."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != LOADER:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module") or "importlib.metadata" in sys.modules:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


class _Loader:
    """The module's own loader, run with the stand-in as ``importlib.metadata``."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def create_module(self, spec: Any) -> Any:
        return self.real.create_module(spec)

    def exec_module(self, module: Any) -> None:
        stand_in = _metadata()
        sys.modules["importlib.metadata"] = stand_in
        try:
            self.real.exec_module(module)
        finally:
            if sys.modules.get("importlib.metadata") is stand_in:
                del sys.modules["importlib.metadata"]

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package, ...: the real loader's
        return getattr(self.real, name)


def _metadata() -> Any:
    """A module standing in for ``importlib.metadata``: ``entry_points`` finds no pydantic plugin (any other group is
    the real module's answer); any other name is the real module's, which loads it."""
    import types

    stand_in = types.ModuleType("importlib.metadata")

    def real() -> Any:
        if sys.modules.get("importlib.metadata") is stand_in:
            del sys.modules["importlib.metadata"]
        import importlib.metadata

        return importlib.metadata

    def entry_points(**params: Any) -> Any:
        if params == {"group": GROUP}:
            return ()
        return real().entry_points(**params)

    def attribute(name: str) -> Any:
        if name.startswith("__"):  # ``from … import`` asks for ``__path__`` first: a module, not a package
            raise AttributeError(name)
        return getattr(real(), name)

    stand_in.entry_points = entry_points  # type: ignore[attr-defined]
    stand_in.__getattr__ = attribute  # type: ignore[attr-defined]
    return stand_in
