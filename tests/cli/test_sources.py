"""What a deploy sends, as users name it: files named in sources whatever the ignore files say, ignore files with
`!` inside named folders, the warning about what was left out, and symlinks that never leave the project.

Real CLI, local target, real tmux, real registry; the revision is read back from the target's own folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.conftest import Project, snapshot, wait_for
from tests.unit.test_sources import NANOGPT_GITIGNORE

TRAIN = """\
import hashlib, time
data = open("data/shakespeare_char/train.bin", "rb").read()
print(f"step=1 loss=1.0 train_bin={hashlib.sha256(data).hexdigest()[:12]}", flush=True)
time.sleep(30)
"""


def nanogpt(project: Project, sources: str, extra: str = "") -> bytes:
    """The project as nanoGPT lays it out (its real .gitignore), with ``sources`` in orch.toml; the train.bin."""
    data = project.path / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    (project.path / ".gitignore").write_text(NANOGPT_GITIGNORE)
    (project.path / "train.py").write_text(TRAIN)
    train_bin = bytes(range(256)) * 300
    (data / "train.bin").write_bytes(train_bin)
    (data / "val.bin").write_bytes(b"\x07" * 999)
    (data / "meta.pkl").write_bytes(b"\x80\x04pickled vocab")
    (data / "prepare.py").write_text("print('prepare')\n")
    project.configure()
    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(text.replace('sources = ["train.py"]', f"sources = {sources}\n{extra}"))
    return train_bin


def deployed_revision(project: Project, *args: str) -> Path:
    res = project.cli("deploy", "--json", *args)
    assert res.exit_code == 0, res.output
    return project.root / "revisions" / json.loads(res.stdout)["experiment"]["revision"]


def test_a_data_file_named_in_sources_reaches_the_run_although_gitignore_drops_it(project):
    train_bin = nanogpt(project, '["train.py", "data/shakespeare_char/train.bin"]')
    res = project.run("deploy", "--wait=30")
    assert res.returncode == 0, res.stderr
    assert "first metrics after" in res.stdout and "train_bin=" in res.stdout  # the run read it: no crash
    assert "left out" not in res.stderr  # nothing under a named folder was dropped
    exp = project.registry().get(1)
    folder = project.root / "revisions" / exp.revision
    assert (folder / "data" / "shakespeare_char" / "train.bin").read_bytes() == train_bin
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.name != ".orch-manifest.json") == \
        ["data/shakespeare_char/train.bin", "train.py"]
    assert project.cli("stop").exit_code == 0


def test_a_named_folder_honours_orchignore_negation_and_the_dry_run_says_what_is_left_out(project):
    train_bin = nanogpt(project, '["train.py", "data"]')
    (project.path / ".orchignore").write_text("# our data is small: send it\n!*.bin\n")
    res = project.cli("deploy", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "(4 files," in res.stdout  # train.py, prepare.py, train.bin, val.bin
    assert "warning: 1 path(s) under [project] sources left out of the revision:" in res.stderr
    assert "  data/shakespeare_char/meta.pkl (.gitignore line 15: meta.pkl)" in res.stderr
    assert "hint: to send one, name it in [project] sources, or add a line !meta.pkl to .orchignore" in res.stderr
    assert "left out" not in res.stdout

    as_json = project.cli("deploy", "--dry-run", "--json")
    assert as_json.exit_code == 0, as_json.output
    plan = json.loads(as_json.stdout)  # stdout is only JSON; the warning is on stderr
    assert plan["left_out"] == [{"path": "data/shakespeare_char/meta.pkl", "rule": ".gitignore line 15: meta.pkl"}]
    assert "meta.pkl" in as_json.stderr

    folder = deployed_revision(project)
    assert (folder / "data" / "shakespeare_char" / "train.bin").read_bytes() == train_bin
    assert not (folder / "data" / "shakespeare_char" / "meta.pkl").exists()
    assert project.cli("stop").exit_code == 0


def test_a_git_repository_and_a_plain_folder_deploy_the_same_revision(project, tmp_path):
    nanogpt(project, '["train.py", "data"]')
    (project.path / ".orchignore").write_text("!*.bin\n")
    repo = Project(tmp_path / "repo", project.root)
    shutil.copytree(project.path, repo.path)
    git = ["git", "-C", str(repo.path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "nanogpt"], check=True)
    plain = json.loads(project.cli("deploy", "--dry-run", "--json").stdout)
    tracked = json.loads(repo.cli("deploy", "--dry-run", "--json").stdout)
    assert plain["revision"] == tracked["revision"] and plain["left_out"] == tracked["left_out"]
    assert "train.bin" not in str(tracked["left_out"])


def with_link(project: Project, tmp_path: Path) -> bytes:
    """A project whose data folder (named in sources) holds a link to a file outside the project."""
    secret = tmp_path / "outside" / "shadow"
    secret.parent.mkdir(exist_ok=True)
    secret.write_bytes(b"root:$6$not-for-the-target$hash:19000:0:99999:7:::\n")
    (project.path / "data").mkdir(exist_ok=True)
    (project.path / "data" / "vocab.txt").write_text("a b c\n")
    link = project.path / "data" / "shadowlink"
    link.symlink_to(secret)
    project.configure()
    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(text.replace('sources = ["train.py"]', 'sources = ["train.py", "data"]'))
    return secret.read_bytes()


def holding(root: Path, content: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.read_bytes() == content]


def test_a_link_to_a_file_outside_the_project_is_refused_before_anything_is_sent(project, tmp_path):
    project.configure(steps=5)
    assert project.cli("deploy").exit_code == 0  # the target is in use: a refused deploy must leave it as it is
    wait_for(lambda: (project.run_dir(1) / "exit.json").exists(), timeout=60, what="experiment 1 to end")
    before = snapshot(project.root)
    secret = with_link(project, tmp_path)
    res = project.run("deploy", "-m", "with the link")
    assert res.returncode == 2, res.stdout + res.stderr
    assert (f"error: symlink data/shadowlink -> {tmp_path}/outside/shadow points outside the project folder"
            in res.stderr)
    assert 'hint: to send what it points to, list it in orch.toml: [project] follow_symlinks = ["data/shadowlink"]' \
        in res.stderr
    assert holding(project.root, secret) == [] and snapshot(project.root) == before
    assert [e.id for e in project.registry().list()] == [1]

    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(
        text.replace('sources = ["train.py", "data"]',
                     'sources = ["train.py", "data"]\nfollow_symlinks = ["data/shadowlink"]'))
    folder = deployed_revision(project, "-m", "the link allowed")
    sent = folder / "data" / "shadowlink"
    assert not sent.is_symlink() and sent.read_bytes() == secret
    assert project.cli("stop").exit_code == 0


def test_folder_links_loops_and_dangling_links(project, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"big data")
    (project.path / "shared").mkdir()
    (project.path / "shared" / "vocab.json").write_text('{"a": 1}')
    (project.path / "data").mkdir()
    (project.path / "data" / "big").symlink_to(outside, target_is_directory=True)
    project.configure()
    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(text.replace('sources = ["train.py"]', 'sources = ["train.py", "data"]'))

    res = project.cli("deploy")
    assert res.exit_code == 2, res.output
    assert f"error: symlink data/big -> {outside} points outside the project folder" in res.stderr
    assert project.registry().list() == []

    (project.path / "data" / "big").unlink()
    (project.path / "data" / "vocab.json").symlink_to("../shared/vocab.json")
    (project.path / "data" / "common").symlink_to("../shared", target_is_directory=True)
    folder = deployed_revision(project)
    for rel in ("data/vocab.json", "data/common/vocab.json"):
        assert not (folder / rel).is_symlink() and (folder / rel).read_text() == '{"a": 1}'
    assert project.cli("stop").exit_code == 0

    (project.path / "data" / "again").symlink_to("..", target_is_directory=True)
    res = project.cli("deploy")
    assert res.exit_code == 2, res.output
    assert "error: symlink data/again -> .. leads back into a folder that holds it" in res.stderr
    (project.path / "data" / "again").unlink()
    (project.path / "data" / "gone").symlink_to("/nonexistent/orch-test-target")
    res = project.cli("deploy")
    assert res.exit_code == 2, res.output
    assert "error: symlink data/gone -> /nonexistent/orch-test-target cannot be sent: it dangles" in res.stderr
    assert "hint: fix or remove the link, or leave it out with a line data/gone in .orchignore" in res.stderr
    assert len(project.registry().list()) == 1


def test_follow_symlinks_outside_the_project_is_a_config_error(project):
    res = project.cli("deploy", "--dry-run", "--set", "project.follow_symlinks=['../etc']")
    assert res.exit_code == 2, res.output
    assert "project.follow_symlinks = ['../etc']: '../etc' must be a path inside the project folder" in res.stderr
    assert "hint:" in res.stderr


def test_orchs_own_pull_folder_is_never_warned_about(project):
    """After the first orch pull, every deploy warned that the .gitignore'd orch-pull/ was left out, and suggested
    sending it: it is orch's own folder, like .orch."""
    toml = project.path / "orch.toml"
    toml.write_text(toml.read_text().replace('sources = ["train.py"]', 'sources = ["."]'))
    (project.path / ".gitignore").write_text(".orch/\norch-pull/\nruns/\n")
    (project.path / "runs").mkdir()
    (project.path / "runs" / "old.txt").write_text("a file of the user's")
    assert project.run("deploy").returncode == 0
    wait_for(lambda: project.cli("status", "--json").exit_code == 0 and
             json.loads(project.cli("status", "--json").stdout)["state"] == "finished", timeout=60,
             what="experiment 1's end")
    pulled = project.run("pull", "--log")
    assert pulled.returncode == 0, pulled.stderr
    assert (project.path / "orch-pull" / "exp1" / "train.log").exists()
    res = project.run("deploy", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "orch-pull" not in res.stderr, res.stderr
    assert "warning: 1 path(s) under [project] sources left out of the revision:" in res.stderr, res.stderr
    assert "  runs/ (.gitignore line 3: runs/)" in res.stderr, res.stderr
