"""The controller's checkpoint decisions (orchestrator.checkpoints): op arguments, retention, who wrote a
folder, what a launch says and asks. Pure: real settings and a real local target, no agent call."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from orchestrator import checkpoints
from orchestrator.agent.serving import validate
from orchestrator.agent.__main__ import OPS
from orchestrator.config import load_settings
from orchestrator.errors import InputError
from orchestrator.reach.targets import resolve_target

INV = {"path": "/ck/tinylm", "files": 2, "bytes": 3 << 20, "newest": "ckpt-000020.npz", "newest_mtime": 1001.0,
       "retention": [{"entry": "20260101T000000Z-exp1", "bytes": 1 << 20},
                     {"entry": "20260102T000000Z-exp2", "bytes": 2 << 20}],
       "all_files": [{"path": "ckpt-000010.npz", "size": 1, "mtime": 1000.0},
                     {"path": "ckpt-000020.npz", "size": 2, "mtime": 1001.0}]}


def _settings(tmp_path: Path, extra: str = ""):
    (tmp_path / "orch.toml").write_text(
        'default_target = "local"\n[project]\nname = "tinylm"\nsources = ["train.py"]\ncommand = "true"\n'
        f'[targets.local]\nkind = "local"\nroot = "{tmp_path}/root"\ncheckpoints = "{tmp_path}/ck"\n'
        '[checkpoints]\nignore = [".*", "*.partial"]\n' + extra)
    settings = load_settings(tmp_path / "orch.toml", env={})
    return settings, resolve_target(settings, "local")


@pytest.fixture
def place(tmp_path):
    return _settings(tmp_path, "[trash]\nkeep = 3\nmax_gb = 1.5\n")


def _every_op(settings, target) -> list:
    writer = checkpoints.Writer(4)
    return [*checkpoints.probe_ops(target, settings, "keep"), *checkpoints.probe_ops(target, settings, "purge"),
            checkpoints.inventory_op(target), checkpoints.inventory_op(target, settings, with_retention=True),
            checkpoints.check_op(target, [4]),
            checkpoints.trash_op(target, settings, "move", INV, writer, [4], 3, 5),
            checkpoints.trash_op(target, settings, "purge", INV, None, [], None, None),
            checkpoints.clean_now_op(target, settings, {**INV, "path": target.checkpoints}, None),
            checkpoints.restore_op(target, "20260101T000000Z-exp1"),
            checkpoints.purge_op(target, ["20260101T000000Z-exp1"]), checkpoints.move_op(target)]


def test_every_op_names_only_arguments_of_its_agent_function_and_passes_the_agents_checks(place):
    settings, target = place
    ops = _every_op(settings, target)
    assert {op.name for op in ops} == {"ckpt_check", "ckpt_inventory", "ckpt_trash", "ckpt_restore", "ckpt_purge",
                                       "ckpt_move"}
    for op in ops:
        function, _ = OPS[op.name]
        params = set(inspect.signature(function).parameters) - {"layout"}
        assert set(op.args) <= params, (op.name, set(op.args) - params)
        validate.op_args(op.name, op.args)  # raises on an ill-typed argument
        assert op.args["path"] == op.args["configured"] == target.checkpoints


def test_an_experiments_own_folder_is_beside_the_lineages_and_ops_on_it_name_both(place):
    settings, target = place
    conf = target.checkpoints
    assert checkpoints.variant_folder(target, None, 7) == f"{conf}@exp7"
    assert checkpoints.variant_folder(target, {"variant_prefix": f"{conf}/.orch-exp/"}, 7) == f"{conf}/.orch-exp/exp7"
    own = checkpoints.own_folder(target, 7, f"{conf}@exp7")
    assert own == f"{conf}@exp7" and checkpoints.own_folder(target, 3, conf) is None
    for op in (checkpoints.inventory_op(target, settings, path=own), checkpoints.restore_op(target, "e", own),
               checkpoints.purge_op(target, ["e"], own), checkpoints.clean_now_op(target, settings,
                                                                                   {**INV, "path": own}, None)):
        assert (op.args["path"], op.args["configured"]) == (own, conf)
    with pytest.raises(InputError) as old:
        checkpoints.own_folder(target, 7, f"{conf}/exp7")
    assert "where an older orch put them" in old.value.message and f"{conf}@exp7" in old.value.hint
    with pytest.raises(InputError) as other:
        checkpoints.own_folder(target, 7, "/elsewhere/exp7")
    assert "not to" in other.value.message


def test_retention_comes_from_the_trash_settings_in_bytes_and_is_unlimited_without_them(place, tmp_path):
    settings, _ = place
    assert checkpoints.retention(settings) == {"keep": 3, "max_bytes": int(1.5 * (1 << 30))}
    (tmp_path / "bare").mkdir()
    bare, _ = _settings(tmp_path / "bare")
    assert checkpoints.retention(bare) == {"keep": None, "max_bytes": None}
    assert checkpoints.doomed(INV) == ["20260101T000000Z-exp1", "20260102T000000Z-exp2"]
    assert checkpoints.doomed({"files": 0}) == checkpoints.doomed(None) == []


def test_the_probe_checks_before_it_counts_and_only_a_clean_asks_whether_the_folder_can_move(place):
    settings, target = place
    keep_check, keep_inv = checkpoints.probe_ops(target, settings, "keep")
    assert (keep_check.name, keep_inv.name) == ("ckpt_check", "ckpt_inventory")
    assert keep_check.args["busy_check"] is False and keep_check.args["movable"] is False
    assert keep_inv.args["full"] is False and keep_inv.args["ignore"] == [".*", "*.partial"]
    assert keep_inv.args["keep"] == 3  # what a clean would delete is listed, to be confirmed
    move_check, move_inv = checkpoints.probe_ops(target, settings, "move")
    assert move_check.args["movable"] is True and move_inv.args["full"] is False
    purge_check, purge_inv = checkpoints.probe_ops(target, settings, "purge")
    assert purge_check.args["movable"] is True and purge_inv.args["full"] is True  # every file, to delete only those


def test_a_launchs_entry_is_named_after_the_writer_else_the_newest_stopped_run_else_the_parent():
    assert checkpoints.entry_label(checkpoints.Writer(7), [9, 12], 3) == "exp7"
    assert checkpoints.entry_label(None, [9, 12], 3) == "exp12"
    assert checkpoints.entry_label(None, [], 3) == "exp3"
    assert checkpoints.entry_label(None, [], None) == "unknown"


def test_a_clean_deletes_only_the_confirmed_retention_entries_and_a_purge_only_the_confirmed_files(place):
    settings, target = place
    check = checkpoints.check_op(target, [6])
    trash = checkpoints.trash_op(target, settings, "move", INV, None, [6], 5, 7)
    assert check.name == "ckpt_check" and check.args["stopping"] == [6] and check.args["movable"] is True
    assert "busy_check" not in check.args  # the runs not stopping still make it refuse
    assert trash.name == "ckpt_trash"
    assert trash.args["label"] == "exp6" and trash.args["moved_by"] == 7 and trash.args["stopping"] == [6]
    assert trash.args["purge"] is False and trash.args["keep"] == 3
    assert trash.args["retention_allowed"] == ["20260101T000000Z-exp1", "20260102T000000Z-exp2"]
    purge = checkpoints.trash_op(target, settings, "purge", INV, None, [6], 5, 7)
    assert purge.args["purge"] is True and purge.args["purge_only"] == INV["all_files"]
    assert checkpoints.trash_op(target, settings, "move", None, None, [], None, None).args["retention_allowed"] == []


def test_orch_checkpoints_clean_names_the_entry_after_the_writer_or_manual(place):
    settings, target = place
    assert checkpoints.clean_now_op(target, settings, INV, checkpoints.Writer(4)).args["label"] == "exp4"
    op = checkpoints.clean_now_op(target, settings, INV, None)
    assert op.args["label"] == "manual" and op.args["retention_allowed"] == checkpoints.doomed(INV)
    assert "purge" not in op.args and "stopping" not in op.args  # a running writer makes the agent refuse


def test_the_trash_value_is_found_among_the_finished_ops_and_becomes_the_records_fields(place):
    settings, target = place
    ops = [checkpoints.check_op(target, []), checkpoints.trash_op(target, settings, "move", INV, None, [], 1, 2)]
    value = {"action": "moved", "moved": 2, "entry": "e", "entry_path": "/ck/tinylm.trash/e"}
    assert checkpoints.moved(ops, [{"path": "/ck"}, value]) == value
    assert checkpoints.moved(ops, [{"path": "/ck"}]) is None  # it failed before the trash step
    assert checkpoints.moved(ops, None) is None
    assert checkpoints.record(value) == {"checkpoints_action": "moved", "checkpoints_entry": "/ck/tinylm.trash/e"}
    assert checkpoints.record({"action": "purged", "entry": None}) == {"checkpoints_action": "purged",
                                                                       "checkpoints_entry": None}
    assert checkpoints.record(None) == {}


def _confirm(inv, action, *, yes=False, answer=None):
    said, asked = [], []

    def confirm(question):
        asked.append(question)
        return answer

    checkpoints.confirm_launch(inv, action, "CT 200 on pve1", checkpoints.Writer(4), yes=yes,
                               confirm=None if answer is None else confirm, echo=said.append)
    return said, asked


def test_a_launch_says_what_it_will_move_and_what_retention_deletes_then_asks(place):
    said, asked = _confirm(INV, "move", answer=True)
    assert said[0] == "checkpoints: 2 file(s), 3.0 MB in /ck/tinylm (newest ckpt-000020.npz, written by experiment 4)"
    assert "PERMANENTLY DELETE 2 older trash entries: 20260101T000000Z-exp1 (1.0 MB)" in said[1]
    assert asked == ["move to the trash 2 file(s), 3.0 MB (newest ckpt-000020.npz, written by experiment 4) from "
                     "/ck/tinylm on CT 200 on pve1, and PERMANENTLY DELETE trash entries "
                     "20260101T000000Z-exp1, 20260102T000000Z-exp2?"]
    said, asked = _confirm(INV, "purge", answer=True)  # a purge leaves the trash alone
    assert len(said) == 1 and asked[0].startswith("PERMANENTLY DELETE 2 file(s)") and "trash entries" not in asked[0]
    said, asked = _confirm(INV, "move", yes=True)
    assert len(said) == 2 and asked == []
    assert _confirm({**INV, "files": 0}, "move") == ([], [])  # an empty folder: nothing said, nothing asked


def test_a_launch_without_a_way_to_ask_or_told_no_is_refused(place):
    with pytest.raises(InputError, match="refusing to move to the trash checkpoints without confirmation") as exc:
        _confirm(INV, "move")
    assert "--yes" in exc.value.hint
    with pytest.raises(InputError, match="refusing to permanently delete checkpoints"):
        _confirm(INV, "purge")
    with pytest.raises(InputError, match="cancelled: nothing was changed on .*; the 2 checkpoint file") as exc:
        _confirm(INV, "move", answer=False)
    assert exc.value.hint == ("rerun with --yes to move them to the trash without being asked, or without "
                              "--clean-checkpoints to keep them (the new run resumes from them)")


def test_a_kept_folder_is_noticed_with_its_writer():
    assert checkpoints.notice(INV, checkpoints.Writer(4, {"host": "box", "path": "/p2"})) == (
        "checkpoints: /ck/tinylm holds 2 file(s), 3.0 MB (newest ckpt-000020.npz, written by experiment 4 of "
        "another clone of this project (box, /p2)); the run will see them (--clean-checkpoints moves them aside)")
    assert checkpoints.notice({**INV, "files": 0}, None) is None and checkpoints.notice(None, None) is None


def test_a_command_on_an_experiment_takes_the_folder_and_root_it_ran_with_where_it_ran():
    from orchestrator.config import TargetSection
    from orchestrator.reach.targets import Target
    from orchestrator.records.experiments import Experiment

    today = Target("ct200", TargetSection(kind="proxmox", ct=200), "/new/orch", "/ck/tinylm", "python3",
                   machine="ct:200@pve:/new/orch")
    cfg = {"project": {"name": "tinylm"}, "paths": {"root": "/old/orch", "checkpoints": "/ck/{project}"},
           "targets": {}}
    exp = Experiment(id=7, project="tinylm", created=0, target="ct200", revision="r", command="python3 t.py",
                     config=cfg, checkpoints="/else/ck", machine="ct:200@pve:/old/orch")
    got = checkpoints.ran_with(today, exp)
    assert (got.root, got.checkpoints, got.machine) == ("/old/orch", "/else/ck", "ct:200@pve:/old/orch")
    variant = exp.model_copy(update={"checkpoints": "/ck/tinylm@exp7"})
    assert checkpoints.ran_with(today, variant).checkpoints == "/ck/tinylm"  # a variant's lineage
    elsewhere = Target("ct201", TargetSection(kind="proxmox", ct=201), "/new/orch", "/ck/tinylm", "python3",
                       machine="ct:201@pve:/new/orch")
    assert checkpoints.ran_with(elsewhere, exp) is elsewhere  # restart -e 7 --ct 201: that target's own


def test_a_relaunch_records_the_folder_it_uses_in_its_configuration_too():
    from orchestrator.records.experiments import Experiment

    cfg = {"project": {"name": "tinylm"}, "paths": {"root": "/r", "checkpoints": "/x/{project}"},
           "targets": {"local": {"kind": "local", "checkpoints": None}}}
    exp = Experiment(id=7, project="tinylm", created=0, target="local", revision="r", command="python3 t.py",
                     config=cfg, checkpoints="/x/tinylm")
    assert checkpoints.config_with(exp, "/x/tinylm") is exp.config  # they agree: as recorded
    # a row an older orch's restart wrote: its parent's configuration, today's folder
    fixed = checkpoints.config_with(exp.model_copy(update={"checkpoints": "/d/tinylm"}), "/d/tinylm")
    assert fixed["paths"]["checkpoints"] == "/d/tinylm" and cfg["paths"]["checkpoints"] == "/x/{project}"
