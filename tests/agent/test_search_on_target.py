"""A sweep conducted on its target, the agent's side without a run: a later trial's entry is the first one's with
its own checkpoint folder, and the conductor runs in a Python that imports optuna, or the sweep is refused."""

from __future__ import annotations

import sys

import pytest

from orchestrator.agent.layout import Layout
from orchestrator.agent.protocol import AgentFailure
from orchestrator.agent.queue import search, search_loop


def test_a_later_trial_gets_a_checkpoint_folder_of_its_own_wherever_the_template_names_its_first():
    folder = "/ws/ckpt@exp7"
    entry = {"env": {"ORCH_CHECKPOINT_DIR": folder, "OTHER": "/ws/ckpt@exp70"}, "argv": ["--out", f"{folder}/best"],
             "experiment": {"checkpoints": folder, "id": 7}}
    got = search_loop._replaced(entry, folder, "/ws/ckpt@exp12")
    assert got == {"env": {"ORCH_CHECKPOINT_DIR": "/ws/ckpt@exp12", "OTHER": "/ws/ckpt@exp70"},
                   "argv": ["--out", "/ws/ckpt@exp12/best"], "experiment": {"checkpoints": "/ws/ckpt@exp12", "id": 7}}


def test_each_pruner_s_threshold_as_the_controller_reckons_it():
    assert search.threshold("median", "min", [3.0, 1.0, 2.0]) == 2.0
    assert search.threshold("asha", "min", [5.0, 1.0, 4.0, 2.0, 3.0, 6.0]) == 2.0  # the best third's cut-off
    assert search.threshold("asha", "max", [5.0, 1.0, 4.0]) == 5.0
    assert search.threshold("median", "min", []) is None


def test_a_target_where_no_python_imports_optuna_is_refused_with_what_each_said(tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    layout = Layout(str(tmp_path))
    assert search.probe(layout, [])["python"] == sys.executable  # the agent's own, when it has it
    monkeypatch.setattr(search.sys, "executable", "/nonexistent/python3")
    found = search.probe(layout, ["/bin/false"])
    assert found["python"] is None and len(found["tried"]) == 2, found
    entry_dir = tmp_path / "queue" / "p"
    entry_dir.mkdir(parents=True)
    (entry_dir / "00000000000000000001-r1-3.json").write_text('{"exp_id": 3, "registry": "r1", "env": {}}')
    with pytest.raises(AgentFailure) as exc:
        search.start(layout, "p", "s123456", spec={"template": 3, "registry": "r1"}, study=None)
    assert "no Python on the target imports optuna" in exc.value.message and "[env]" in exc.value.hint
    assert not (tmp_path / "sweeps").exists()  # nothing kept for a sweep that cannot run
