"""How the supervisor tells the system's shutdown from an ``orch stop`` (``agent/run/causes.py``)."""

from __future__ import annotations

from orchestrator.agent.run.causes import shutting_down


def test_init_handed_over_to_systemd_shutdown_means_going_down(tmp_path):
    comm = tmp_path / "comm"
    comm.write_text("systemd-shutdow\n")  # PID 1's name, cut at 15 characters, in systemd's final phase
    assert shutting_down(str(comm), running=str(tmp_path / "absent"))


def test_a_running_init_without_systemd_is_not_going_down(tmp_path):
    comm = tmp_path / "comm"
    for init in ("systemd", "init", "bash"):
        comm.write_text(init + "\n")
        assert not shutting_down(str(comm), running=str(tmp_path / "absent"))
    assert not shutting_down(str(tmp_path / "unreadable"), running=str(tmp_path / "absent"))
