"""Putting a failed launch's checkpoints back (``checkpoints.put_back``), through the real agent on this machine."""

from __future__ import annotations

from pathlib import Path

from orchestrator import checkpoints
from orchestrator.config import load_settings
from orchestrator.reach.agent_client import AgentClient
from orchestrator.reach.targets import resolve_target


def _moved_aside(tmp_path: Path):
    """A local target whose checkpoint folder's one file a launch's trash step moved aside."""
    (tmp_path / "orch.toml").write_text(
        'default_target = "local"\n[project]\nname = "tinylm"\nsources = ["train.py"]\ncommand = "true"\n'
        f'[targets.local]\nkind = "local"\nroot = "{tmp_path}/root"\ncheckpoints = "{tmp_path}/ck"\n')
    settings = load_settings(tmp_path / "orch.toml", env={})
    target = resolve_target(settings, "local")
    ck = Path(target.checkpoints)
    ck.mkdir()
    (ck / "ckpt-000010.npz").write_bytes(b"step 10")
    client = AgentClient(target.connect(), target.root, target.python)
    trash = client.call([checkpoints.trash_op(target, settings, "move", None, None, [], 1, 2)], lock=5)[0]
    assert trash["action"] == "moved" and not (ck / "ckpt-000010.npz").exists()
    return settings, target, client, trash


def test_the_entry_goes_back_into_the_folder_over_a_connection_of_its_own(tmp_path):
    settings, target, _, trash = _moved_aside(tmp_path)
    back = checkpoints.put_back(target, settings, trash["entry"], trash["entry_path"], what="put back",
                                moved=trash["moved"])
    assert back.said == f"the 1 checkpoint file(s) it moved aside were put back in {target.checkpoints}"
    assert back.fields == {"checkpoints_action": "restored", "checkpoints_entry": None}
    assert (Path(target.checkpoints) / "ckpt-000010.npz").read_bytes() == b"step 10"
    assert not Path(trash["entry_path"]).exists()


def test_an_entry_that_would_overwrite_stays_where_it_is_and_the_sentence_says_how_to_restore_it(tmp_path):
    settings, target, client, trash = _moved_aside(tmp_path)
    newer = Path(target.checkpoints) / "ckpt-000010.npz"
    newer.write_bytes(b"written since")
    back = checkpoints.put_back(target, settings, trash["entry"], trash["entry_path"], what="put back",
                                client=client, moved=trash["moved"])
    assert back.said.startswith(f"the checkpoints it moved aside are in {trash['entry_path']} on local "
                                "(putting them back failed: 1 name(s) from"), back.said
    assert back.said.endswith(f"orch checkpoints restore {trash['entry']} puts them back")
    assert back.fields == {"checkpoints_action": "moved", "checkpoints_entry": trash["entry_path"]}
    assert newer.read_bytes() == b"written since"
    assert (Path(trash["entry_path"]) / "ckpt-000010.npz").read_bytes() == b"step 10"
