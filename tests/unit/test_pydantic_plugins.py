"""pydantic's plugin loader in the orch command: loaded without importlib.metadata, finding no plugin; the real
module for everyone else. Each case in a fresh interpreter, as a command starts."""

from __future__ import annotations

import json
import subprocess
import sys

BUILD = """\
import json, sys
from orchestrator.cli import pydantic_plugins
pydantic_plugins.install()
from pydantic import BaseModel
class Section(BaseModel):
    n: int = 1
shown = Section.model_validate({"n": "3"}).n
from pydantic.plugin import _loader
out = {"n": shown, "metadata_loaded": "importlib.metadata" in sys.modules, "plugins": list(_loader.get_plugins()),
       "finders_left": sum(type(f).__module__ == "orchestrator.cli.pydantic_plugins" for f in sys.meta_path)}
scripts = _loader.entry_points(group="console_scripts")  # any other question: the real module's answer
import importlib.metadata, pydantic
out.update(real=not hasattr(importlib.metadata, "versions_only") and importlib.metadata.__file__ is not None,
           version=importlib.metadata.version("pydantic") == pydantic.VERSION, orch="orch" in scripts.names)
print(json.dumps(out))
"""


def _run(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_installed_pydantic_builds_models_without_importlib_metadata_and_no_plugin():
    out = _run(BUILD)
    assert out["n"] == 3
    assert out["metadata_loaded"] is False, "pydantic's plugin loader loaded importlib.metadata (pydantic changed?)"
    assert out["plugins"] == []
    assert out["finders_left"] == 0  # the finder steps aside once the loader has loaded


def test_everyone_else_gets_the_real_importlib_metadata():
    out = _run(BUILD)
    assert out["real"] and out["version"] and out["orch"]


def test_nothing_is_installed_where_importlib_metadata_has_loaded():
    out = _run("import importlib.metadata, json, sys\n"
               "from orchestrator.cli import pydantic_plugins\n"
               "pydantic_plugins.install()\n"
               "import pydantic.plugin._loader as loader\n"
               "print(json.dumps({'finders': sum(type(f).__module__ == 'orchestrator.cli.pydantic_plugins' "
               "for f in sys.meta_path), 'same': loader.entry_points is importlib.metadata.entry_points}))")
    assert out == {"finders": 0, "same": True}
