"""The command line forgives what a user gets nearly right (the real CLI, a real run on the local target):
global options after the command, a mistyped command pointed at the one meant, and a typo in orch.toml that
keeps nobody from looking at or stopping a run while it refuses what would launch one."""

from __future__ import annotations

from tests.conftest import wait_for


def test_config_after_the_command_is_read_as_before_it(project, tmp_path):
    config = str(project.path / "orch.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    project.path, home = elsewhere, project.path  # run from a folder with no orch.toml above it
    try:
        assert "no orch.toml" in project.run("status").stderr
        after = project.run("deploy", "--dry-run", "--config", config, "--verbose")
        before = project.run("--config", config, "--verbose", "deploy", "--dry-run")
        equals = project.run("deploy", "--dry-run", f"--config={config}")
    finally:
        project.path = home
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout == equals.stdout and "train.py" in after.stdout


def test_a_command_of_a_group_typed_alone_is_pointed_at(project):
    shown = project.run("compare", "1", "2")
    assert shown.returncode == 2
    assert "did you mean `orch experiments compare`?" in shown.stderr.lower()
    assert "did you mean 'status'" in project.run("statsu").stderr.lower()  # typer's own, still there
    # a group's sub-command of that very name beats typer's near top-level one (restore ~ restart)
    assert "Did you mean `orch checkpoints restore`?" in project.run("restore").stderr
    several = project.run("show").stderr
    assert "Did you mean `orch experiments show`, " in several and " or `orch sweep show`" in several


def test_a_typo_in_the_config_warns_status_and_stop_and_refuses_a_deploy(project):
    project.configure(steps=100000, sleep=0.05)
    assert project.run("deploy", "-m", "long").returncode == 0
    config = project.path / "orch.toml"
    config.write_text(config.read_text().replace("stop_timeout = 5", "stop_timeout = 5\nstop_timout = 5"))

    refused = project.run("deploy", "-m", "again")
    assert refused.returncode != 0 and "unknown key 'run.stop_timout'" in refused.stderr
    with project.registry() as reg:
        assert len(reg.list()) == 1  # nothing launched

    wait_for(lambda: "running" in project.run("status").stdout, what="the run is running")
    status = project.run("status")
    assert status.returncode == 0 and "warning: invalid configuration" in status.stderr
    assert "run.stop_timout" in status.stderr
    stopped = project.run("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "warning: invalid configuration" in stopped.stderr
    assert "running" not in project.run("status").stdout


def test_global_options_move_before_the_command_unless_it_owns_them():
    from orchestrator.cli.main import root_command
    from orchestrator.cli.parsing import hoisted

    root = root_command()
    ctx = root.context_class(root, info_name="orch", **root.context_settings)
    cases = {
        ("deploy", "--config", "x", "-m", "hi"): ("--config", "x", "deploy", "-m", "hi"),
        ("experiments", "show", "1", "--verbose"): ("--verbose", "experiments", "show", "1"),
        ("--verbose", "stop", "--config=x"): ("--verbose", "--config=x", "stop"),
        # after --, and after exec's first free word, the words are the command's own
        ("exec", "--config", "x", "--", "ls", "--config", "y"): ("--config", "x", "exec", "--", "ls", "--config", "y"),
        ("exec", "ls", "--config", "y"): ("exec", "ls", "--config", "y"),
        ("batching", "plan", "--config", "x"): ("batching", "plan", "--config", "x"),  # its own --config
        ("deploy", "-m", "--config"): ("deploy", "-m", "--config"),  # a message that reads --config
        ("nosuch", "--config", "x"): ("nosuch", "--config", "x"),
    }
    for given, read in cases.items():
        assert tuple(hoisted(root, ctx, list(given))) == read, given


def _live_run(project) -> None:
    project.configure(steps=100000, sleep=0.05)
    assert project.run("deploy", "-m", "long").returncode == 0
    wait_for(lambda: "running" in project.run("status").stdout, what="the run is running")


def _looked_at_and_stopped(project, said: str) -> None:
    """status, logs and stop act on the live run of the local target orch.toml no longer names, each warning
    with ``said``; the run is stopped and recorded as such."""
    status = project.run("status")
    assert status.returncode == 0, status.stderr
    assert "running" in status.stdout and said in status.stderr, status.stderr
    logs = project.run("logs", "-n", "5")
    assert logs.returncode == 0, logs.stderr
    assert "step=" in logs.stdout and said in logs.stderr
    stopped = project.run("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert said in stopped.stderr
    with project.registry() as reg:
        assert reg.get(1).status == "stopped"
    assert "running" not in project.run("status").stdout


def test_a_toml_syntax_error_never_blocks_status_logs_or_stop(project):
    _live_run(project)
    config = project.path / "orch.toml"
    config.write_text(config.read_text().replace("stop_timeout = 5", "stop_timeout = 30s"))
    line = next(i for i, text in enumerate(config.read_text().splitlines(), 1) if "30s" in text)

    refused = project.run("deploy", "-m", "again")
    assert refused.returncode == 2 and "not valid TOML" in refused.stderr
    assert "`orch init --print`" in refused.stderr  # a hint that works where orch.toml already exists
    assert project.run("init", "--print").stdout.startswith("# orch.toml")
    # where the file is wrong, then that the run's own recorded settings are read instead
    _looked_at_and_stopped(project, f"(at line {line}, column 18)")
    assert "read with the settings experiment 1 was launched with" in project.run("status").stderr
    with project.registry() as reg:
        assert len(reg.list()) == 1  # nothing launched
    config.write_bytes(b"\xff\xfe[project]\n")  # not even text
    unreadable = project.run("status")
    assert unreadable.returncode == 0 and "experiment 1 stopped" in unreadable.stdout, unreadable.stderr
    assert "not valid TOML: 'utf-8' codec can't decode byte 0xff" in unreadable.stderr


def test_an_unknown_default_target_never_blocks_status_logs_or_stop(project):
    _live_run(project)
    config = project.path / "orch.toml"
    config.write_text(config.read_text().replace('default_target = "local"', 'default_target = "gpu-box"'))

    refused = project.run("deploy", "-m", "again")
    assert refused.returncode == 2 and "default_target = 'gpu-box': is not one of the [targets]" in refused.stderr
    _looked_at_and_stopped(project, "default_target = 'gpu-box': is not one of the [targets] (local)")
    assert "default_target read as 'local': experiment 1 ran there" in project.run("status").stderr
