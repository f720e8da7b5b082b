"""Before a launch stops anything: will the new run be able to start?

``check`` runs inside the locked apply, before ``run_stop`` and ``ckpt_trash``, and refuses (touching
nothing) what would make ``runs.start`` fail afterwards: a run folder that already exists, a revision
that is not there, secrets of the wrong shape, no tmux, folders the agent cannot create, or a live run
of the project that this launch does not stop, or one node of a job that it would stop alone. What is left to fail after the old run is stopped is what
no check can foresee (the container killed during the start); the controller then puts the moved
checkpoints back.
"""

from __future__ import annotations

import os
import shutil

from .. import journal
from ..queue import gpu_share
from . import handover
from ..layout import Layout, read_json
from ..protocol import AgentFailure
from .runs import alive_runs


def _creatable(path: str, write_in: bool) -> bool:
    """Whether ``path`` is a folder (one we can write in, with ``write_in``) or can be created."""
    probe = os.path.normpath(path)
    if os.path.isdir(probe) and not write_in:
        return True
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    return os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK)


def check(layout: Layout, exp_id: int, project: str, revision: str, registry: str | None = None,
          secrets: list | None = None, checkpoints: str | None = None, stops_runs: bool = True,
          revision_pending: bool = False, spare_jobs: bool = False, beside: str | None = None) -> dict:
    """Raise the failure ``runs.start`` would meet.

    ``stops_runs``: a ``run_stop`` of the project comes first; ``revision_pending``: assembled later in this call;
    ``spare_jobs``: a launch on this target alone, which must not stop one node of a job (started since its probe);
    ``beside``: the new run's ``CUDA_VISIBLE_DEVICES``, none of them given to a live run (``gpu_share.check``).
    """
    run_dir = layout.run_dir(exp_id, registry)
    if os.path.lexists(run_dir) and not journal.only_launch(run_dir):  # this launch's journal may be there
        other = (read_json(os.path.join(run_dir, "experiment.json"), {}) or {}).get("project")
        raise AgentFailure("safety", f"run folder {run_dir} already exists (project {other}); nothing was stopped",
                           "give each project its own [paths] root, or remove the stale run folder")
    if not revision_pending and not os.path.isdir(layout.revision(revision)):
        raise AgentFailure("notfound", f"revision {revision} is not on the target; nothing was stopped",
                           "deploy again to push it")
    handover.check({name: "" for name in secrets or []})
    if shutil.which("tmux") is None:
        raise AgentFailure("agent", "tmux is not installed on the target; nothing was stopped",
                           "install tmux there (apt-get install tmux)")
    # the run's folder is made in runs/; the checkpoint folder only has to exist (a read-only one is the run's affair)
    for what, path, write_in in (("runs folder", layout.runs, True), ("checkpoint folder", checkpoints, False)):
        if path and not _creatable(path, write_in):
            raise AgentFailure("safety", f"the {what} {path} cannot be created or written; nothing was stopped",
                               "check its owner and permissions on the target")
    if stops_runs and spare_jobs:
        node = next((r for r in alive_runs(layout, project) if r.get("job")), None)
        if node is not None:
            raise AgentFailure("conflict", f"experiment {node['id']} of project {project} runs here as one node of a "
                               f"job over {len(node['job']['nodes'])} nodes, and this launch would stop only this "
                               "node; nothing was stopped", "stop the whole job first (orch stop naming its nodes)")
    if beside is not None:
        gpu_share.check(layout, beside)
    busy = [] if stops_runs or beside is not None else alive_runs(layout, project)
    if busy:
        raise AgentFailure("conflict", f"experiment {busy[0]['id']} of project {project} is running and this "
                           "launch does not stop it; nothing was changed", "stop it first (orch stop)")
    return {"run_dir": run_dir}
