"""Configuration: one precedence, and errors that name the source, the key and the allowed values."""

from __future__ import annotations

import pytest

from orchestrator.config import Settings, find_config, load_settings, local_root
from orchestrator.errors import ConfigError


def write(path, text):
    path.write_text(text)
    return path


def test_precedence_defaults_file_env_flags(tmp_path):
    cfg = write(tmp_path / "orch.toml", '[batching]\nstrategy = "sorted"\nseed = 1\ntoken_budget = 9000\n')
    s = load_settings(cfg, env={})
    assert (s.batching.strategy, s.batching.seed, s.batching.token_budget, s.batching.max_seq_len) == \
        ("sorted", 1, 9000, 8192)
    s = load_settings(cfg, env={"ORCH_BATCHING__STRATEGY": "shuffle", "ORCH_BATCHING__SEED": "2"})
    assert (s.batching.strategy, s.batching.seed) == ("shuffle", 2)
    s = load_settings(cfg, env={"ORCH_BATCHING__SEED": "2"}, overrides=["batching.seed=3",
                                                                       "batching.buckets=[0, 100, 8192]"])
    assert s.batching.seed == 3 and s.batching.buckets == [0, 100, 8192]
    # the secret's variable is not a setting and never trips validation
    assert load_settings(cfg, env={"ORCH_PROXMOX_TOKEN": "s3cret"}).batching.seed == 1


def test_found_by_walking_up(tmp_path):
    cfg = write(tmp_path / "orch.toml", '[project]\nname = "walk"\n')
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_config(deep) == cfg
    s = load_settings(env={}, start=deep)
    assert s.project.name == "walk" and s.project_dir == tmp_path and s.state_dir == tmp_path / ".orch"


@pytest.mark.parametrize("text, env, flags, expected", [
    ('[batching]\nstrategy = "fast"\n', {}, [], ["orch.toml: batching.strategy = 'fast'", "'sorted', 'shuffle'"]),
    ('[batching]\ncolour = 1\n', {}, [], ["unknown key 'batching.colour'", "allowed here:", "token_budget"]),
    ('', {"ORCH_BATCHING__TOKEN_BUDGET": "-1"}, [], ["environment variable ORCH_BATCHING__TOKEN_BUDGET"]),
    ('', {}, ["run.stop_timeout=soon"], ["--set run.stop_timeout", "'soon'"]),
    ('[targets.gpu]\nkind = "ssh"\n', {}, [], ["targets.gpu", "needs host"]),
    ('default_target = "gpu"\n', {}, [], ["default_target = 'gpu': is not one of the [targets] (local)"]),
    ('[proxmox]\nhost = "pve"\ntoken_id = "orch"\n', {}, [], ["USER@REALM!TOKENID"]),
    ('[project]\nsources = ["../outside"]\n', {}, [], ["must be a path inside the project folder"]),
    ('[batching\n', {}, [], ["not valid TOML"]),
])
def test_errors_name_source_key_and_allowed_values(tmp_path, text, env, flags, expected):
    cfg = write(tmp_path / "orch.toml", text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, env=env, overrides=flags)
    for part in expected:
        assert part in err.value.message
    assert err.value.hint


def test_missing_explicit_config_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", env={})


def test_builtin_local_target_always_exists(tmp_path):
    s = load_settings(write(tmp_path / "orch.toml", ""), env={})
    assert s.default_target == "local" and s.targets["local"].kind == "local"


def test_the_local_root_is_a_per_user_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert local_root() == str(tmp_path / "data" / "orch" / "local")
    s = Settings()
    assert s.targets["local"].root == local_root()
    assert s.targets["local"].checkpoints == local_root() + "/checkpoints/{project}"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert local_root() == str(tmp_path / "home" / ".local" / "share" / "orch" / "local")


def test_init_writes_a_config_that_loads(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["init", "--name", "demo"])
    assert res.exit_code == 0, res.output
    s = load_settings(tmp_path / "orch.toml", env={})
    assert s.project.name == "demo" and s.batching.strategy == "megabatch"
    assert s.targets["local"].root == local_root() and "/tmp" not in (tmp_path / "orch.toml").read_text()
    again = CliRunner().invoke(app, ["init"])
    assert again.exit_code == 2 and "already exists" in again.output
    # its commented settings are today's names: uncommented, they load without a warning
    text = (tmp_path / "orch.toml").read_text()
    (tmp_path / "orch.toml").write_text(text.replace("# restarts = 3", "restarts = 3")
                                        .replace("# stall_after = 1800", "stall_after = 1800"))
    told: list[str] = []
    s = load_settings(tmp_path / "orch.toml", env={}, notice=told.append)
    assert (s.run.restarts, s.run.stall_after, told) == (3, 1800.0, [])


def test_commands_need_a_project_config(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCH_CONFIG", raising=False)
    for args in (["deploy"], ["status"], ["experiments", "list"], ["checkpoints", "list"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "no orch.toml" in res.output and "orch init" in res.output
    assert not (tmp_path / ".orch").exists()


@pytest.mark.parametrize("text, env, new, value", [
    ('[distributed]\nmax_restarts = 2\n', {}, ("run", "restarts"), 2),
    ('[run]\nstall_timeout = 1800\n', {}, ("run", "stall_after"), 1800.0),
    ('[metrics]\nstall_after = 600\n', {}, ("run", "stall_after"), 600.0),
    ('', {"ORCH_DISTRIBUTED__MAX_RESTARTS": "4"}, ("run", "restarts"), 4),
])
def test_an_old_key_is_read_as_its_new_one_with_one_warning(tmp_path, text, env, new, value):
    told: list[str] = []
    s = load_settings(write(tmp_path / "orch.toml", text), env=env, notice=told.append)
    assert getattr(getattr(s, new[0]), new[1]) == value
    assert len(told) == 1 and f"is now [{new[0]}] {new[1]}" in told[0] and "rename it" in told[0]
    assert "\n" not in told[0]


def test_the_new_keys_alone_warn_nothing(tmp_path):
    told: list[str] = []
    s = load_settings(write(tmp_path / "orch.toml", "[run]\nrestarts = 1\nstall_after = 90\n"), env={},
                      notice=told.append)
    assert (s.run.restarts, s.run.stall_after, told) == (1, 90.0, [])
    assert s.run.recovery()["stall_timeout"] == 90.0  # what the supervisor is told


@pytest.mark.parametrize("text", [
    '[run]\nrestarts = 3\n[distributed]\nmax_restarts = 1\n',
    '[run]\nstall_after = 60\nstall_timeout = 120\n',
    '[run]\nstall_timeout = 60\n[metrics]\nstall_after = 300\n',
])
def test_an_old_and_a_new_key_that_disagree_are_an_error(tmp_path, text):
    told: list[str] = []
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path / "orch.toml", text), env={}, notice=told.append)
    assert "disagree" in err.value.message and "is the old name of" in err.value.message
    assert err.value.hint.startswith("keep only [run] ")


def test_old_and_new_keys_that_agree_or_sit_in_different_layers(tmp_path):
    cfg = write(tmp_path / "orch.toml", '[run]\nrestarts = 2\n[distributed]\nmax_restarts = 2\n')
    assert load_settings(cfg, env={}, notice=lambda _m: None).run.restarts == 2
    cfg = write(tmp_path / "orch.toml", '[run]\nstall_timeout = 60\n')
    told: list[str] = []
    s = load_settings(cfg, env={}, overrides=["run.stall_after=5"], notice=told.append)
    assert s.run.stall_after == 5.0 and len(told) == 1  # the flag wins over the file, as for any key


def test_a_record_from_before_the_renames_reads_under_the_new_names():
    from orchestrator.config import recorded_as_now

    old = {"run": {"restarts": 1, "stall_timeout": 900.0}, "metrics": {"patterns": {}, "stall_after": 300.0},
           "distributed": {"port": 29400, "max_restarts": 0}}
    assert recorded_as_now(old) == {"run": {"restarts": 1, "stall_after": 900.0}, "metrics": {"patterns": {}},
                                    "distributed": {"port": 29400}}  # what its supervisor was told wins
    assert old["run"] == {"restarts": 1, "stall_timeout": 900.0}  # the record itself is left as it was
    assert recorded_as_now({"run": {"stall_after": 5.0}}) == {"run": {"stall_after": 5.0}}


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1:9", ("127.0.0.1", 9, "https://127.0.0.1:9")),
    ("pve1.lan", ("pve1.lan", 8006, "https://pve1.lan:8006")),
    ("[fd00::1]:8007", ("fd00::1", 8007, "https://[fd00::1]:8007")),
])
def test_a_proxmox_host_with_its_port_is_split(tmp_path, host, expected):
    from orchestrator.reach.proxmox import ProxmoxClient

    cfg = write(tmp_path / "orch.toml", f'[proxmox]\nhost = "{host}"\ntoken_id = "root@pam!orch"\n')
    section = load_settings(cfg, env={}).proxmox
    url = ProxmoxClient(section.host, section.port, token_id=section.token_id, token_secret="x").url
    assert (section.host, section.port, url) == expected


@pytest.mark.parametrize("text, says", [
    ('host = "https://pve1:8006"', "is a URL: give the name or address alone"),
    ('host = "pve1:api"', "'api' is not a port"),
    ('host = "pve1:8007"\nport = 8006', "names port 8007, but port = 8006: keep one"),
])
def test_a_proxmox_host_that_is_no_host_is_refused_clearly(tmp_path, text, says):
    cfg = write(tmp_path / "orch.toml", f'[proxmox]\n{text}\ntoken_id = "root@pam!orch"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(cfg, env={})
    assert says in refused.value.message and "orch.toml" in refused.value.message


def test_lenient_settings_leave_a_key_in_error_at_its_default_and_say_so(tmp_path):
    cfg = write(tmp_path / "orch.toml", '[run]\nstop_timeout = "soon"\nterm_timeout = 4\n'
                                        '[targets.ct9]\nkind = "proxmox"\nct = "nine"\n')
    with pytest.raises(ConfigError):
        load_settings(cfg, env={})
    said: list[str] = []
    s = load_settings(cfg, env={}, lenient=True, notice=said.append)
    assert (s.run.stop_timeout, s.run.term_timeout) == (30, 4) and "ct9" not in s.targets
    assert "run.stop_timeout = 'soon'" in said[0] and "targets.ct9.ct" in said[0]
