"""Which files make a revision: named paths, ignore files inside named folders, symlinks (real folders, real git)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.launch import revisions
from orchestrator.errors import InputError
from orchestrator.launch.sources import collect, left_out_warning

# karpathy/nanoGPT's .gitignore, line for line
NANOGPT_GITIGNORE = """\
.DS_Store
.idea
.ipynb_checkpoints/
.vscode
__pycache__/
*.bin
*.pkl
*.pt
*.txt
*.pyc
*.npz
input.txt
train.npy
val.npy
meta.pkl

model_ckpts/
wandb/
predictions/
data/
model-ckpts/
"""


def nanogpt(path: Path) -> Path:
    data = path / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    (path / ".gitignore").write_text(NANOGPT_GITIGNORE)
    (path / "train.py").write_text("print('train')\n")
    (data / "prepare.py").write_text("print('prepare')\n")
    (data / "train.bin").write_bytes(bytes(range(256)) * 64)
    (data / "val.bin").write_bytes(b"\x01\x02" * 100)
    (data / "meta.pkl").write_bytes(b"pickle")
    (data / "input.txt").write_text("First Citizen:\n")
    return path


def test_a_named_file_is_sent_whatever_the_gitignore_says(tmp_path):
    proj = nanogpt(tmp_path)
    sel = collect(proj, ["train.py", "data/shakespeare_char/train.bin"])
    assert list(sel.files) == ["data/shakespeare_char/train.bin", "train.py"]
    assert sel.left_out == []


def test_a_named_folder_follows_the_gitignore_and_orchignore_negation_reincludes(tmp_path):
    proj = nanogpt(tmp_path)
    before = collect(proj, ["train.py", "data"])
    assert list(before.files) == ["data/shakespeare_char/prepare.py", "train.py"]
    assert {d.path: d.rule for d in before.left_out} == {
        "data/shakespeare_char/input.txt": ".gitignore line 12: input.txt",
        "data/shakespeare_char/meta.pkl": ".gitignore line 15: meta.pkl",
        "data/shakespeare_char/train.bin": ".gitignore line 6: *.bin",
        "data/shakespeare_char/val.bin": ".gitignore line 6: *.bin"}
    (proj / ".orchignore").write_text("!*.bin\n")
    after = collect(proj, ["train.py", "data"])
    assert list(after.files) == ["data/shakespeare_char/prepare.py", "data/shakespeare_char/train.bin",
                                 "data/shakespeare_char/val.bin", "train.py"]
    assert [d.path for d in after.left_out] == ["data/shakespeare_char/input.txt", "data/shakespeare_char/meta.pkl"]


def test_the_whole_project_named_leaves_out_the_ignored_folder_as_one_entry(tmp_path):
    proj = nanogpt(tmp_path)
    sel = collect(proj, ["."])
    assert list(sel.files) == [".gitignore", "train.py"]
    assert [(d.path, d.rule) for d in sel.left_out] == [("data/", ".gitignore line 20: data/")]


def test_a_git_repository_and_a_plain_folder_give_the_same_revision(tmp_path):
    plain = nanogpt(tmp_path / "plain")
    repo = tmp_path / "repo"
    shutil.copytree(plain, repo)
    (repo / ".orchignore").write_text("!*.bin\n")
    (plain / ".orchignore").write_text("!*.bin\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "nanogpt"], check=True)
    a = revisions.build(plain, ["train.py", "data"])
    b = revisions.build(repo, ["train.py", "data"])
    assert a.id == b.id and a.files == b.files
    assert "data/shakespeare_char/train.bin" in {f["path"] for f in b.files}
    assert b.git_commit and a.git_commit is None


def test_nested_anchored_and_folder_patterns_follow_git(tmp_path):
    (tmp_path / "src" / "logs").mkdir(parents=True)
    (tmp_path / "src" / "deep" / "logs").mkdir(parents=True)
    (tmp_path / "build").mkdir()
    (tmp_path / ".gitignore").write_text("/build\n*.log\nlogs/\n")
    (tmp_path / "src" / ".gitignore").write_text("!keep.log\n/local.py\n")
    for rel in ("src/a.py", "src/a.log", "src/keep.log", "src/local.py", "src/deep/local.py", "src/logs/x.py",
                "src/deep/logs/y.py", "build/out.py", "src/build"):
        (tmp_path / rel).write_text(rel)
    sel = collect(tmp_path, ["."])
    assert list(sel.files) == [".gitignore", "src/.gitignore", "src/a.py", "src/build", "src/deep/local.py",
                               "src/keep.log"]
    assert {d.path: d.rule for d in sel.left_out} == {
        "build/": ".gitignore line 1: /build", "src/a.log": ".gitignore line 2: *.log",
        "src/local.py": "src/.gitignore line 2: /local.py", "src/logs/": ".gitignore line 3: logs/",
        "src/deep/logs/": ".gitignore line 3: logs/"}


def test_orchignore_wins_over_gitignore_and_can_reinclude_the_built_in_set_but_never_git_or_orch(tmp_path):
    for rel in ("a.py", "__pycache__/a.cpython-311.pyc", ".git/config", ".orch/secrets.env", "notes.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / ".gitignore").write_text("*.py\n")
    assert list(collect(tmp_path, ["."]).files) == [".gitignore", "notes.md"]
    (tmp_path / ".orchignore").write_text("!a.py\n!__pycache__/\n!*.pyc\n!.git/\n!.orch/\nnotes.md\n")
    sel = collect(tmp_path, ["."])
    assert list(sel.files) == [".gitignore", "__pycache__/a.cpython-311.pyc", "a.py"]
    assert [(d.path, d.rule) for d in sel.left_out] == [(".orchignore", "built-in: .orchignore"),
                                                        ("notes.md", ".orchignore line 6: notes.md")]
    with pytest.raises(InputError, match="never sent"):
        collect(tmp_path, [".orch/secrets.env"])


def test_the_built_in_set_is_left_out_without_a_warning(tmp_path):
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"")
    (tmp_path / "a.py").write_text("")
    sel = collect(tmp_path, ["."])
    assert [d.path for d in sel.left_out] == ["__pycache__/"] and left_out_warning(sel.left_out) == []


def test_the_warning_counts_names_the_first_paths_with_their_rules_and_says_how_to_include(tmp_path):
    (tmp_path / "a.py").write_text("")
    for i in range(7):
        (tmp_path / f"shard{i}.bin").write_text("x")
    (tmp_path / ".gitignore").write_text("*.bin\n")
    lines = left_out_warning(collect(tmp_path, ["."]).left_out)
    assert lines[0] == "warning: 7 path(s) under [project] sources left out of the revision:"
    assert lines[1] == "  shard0.bin (.gitignore line 1: *.bin)" and lines[6] == "  ... and 2 more"
    assert lines[-1] == "hint: to send one, name it in [project] sources, or add a line !*.bin to .orchignore"


def outside_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:$6$secret-hash:19000:0:99999:7:::\n")
    return secret


def project_with(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "train.py").write_text("")
    return proj


def test_a_link_to_a_file_outside_refuses_unless_listed(tmp_path):
    secret, proj = outside_secret(tmp_path), project_with(tmp_path)
    (proj / "data" / "shadowlink").symlink_to(secret)
    with pytest.raises(InputError) as err:
        collect(proj, ["train.py", "data"])
    assert f"symlink data/shadowlink -> {secret} points outside the project folder" in err.value.message
    assert 'follow_symlinks = ["data/shadowlink"]' in err.value.hint
    with pytest.raises(InputError, match="points outside"):
        collect(proj, ["data/shadowlink"])  # named itself
    sel = collect(proj, ["train.py", "data"], ["data/shadowlink"])
    assert sel.files["data/shadowlink"] == secret.resolve()


def test_a_folder_link_outside_refuses_and_one_inside_is_sent_as_its_content(tmp_path):
    secret, proj = outside_secret(tmp_path), project_with(tmp_path)
    (proj / "data" / "big").symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(InputError, match="symlink data/big -> .* points outside the project folder"):
        collect(proj, ["data"])
    with pytest.raises(InputError, match="symlink data/big -> .* points outside"):
        collect(proj, ["data/big/shadow"])  # through a folder link in a named path
    assert list(collect(proj, ["data"], ["data/big"]).files) == ["data/big/shadow"]
    (proj / "data" / "big").unlink()
    (proj / "shared").mkdir()
    (proj / "shared" / "vocab.json").write_text("{}")
    (proj / "data" / "vocab").symlink_to("../shared/vocab.json")
    (proj / "data" / "common").symlink_to("../shared", target_is_directory=True)
    sel = collect(proj, ["data"])
    assert sel.files == {"data/common/vocab.json": proj.resolve() / "shared" / "vocab.json",
                         "data/vocab": proj.resolve() / "shared" / "vocab.json"}


def test_loops_and_dangling_links_are_clear_errors(tmp_path):
    proj = project_with(tmp_path)
    (proj / "data" / "up").symlink_to("..", target_is_directory=True)
    with pytest.raises(InputError, match=r"symlink data/up -> \.\. leads back into a folder that holds it"):
        collect(proj, ["data"])
    (proj / "data" / "up").unlink()
    (proj / "data" / "a").symlink_to("b")
    (proj / "data" / "b").symlink_to("a")
    with pytest.raises(InputError, match="symlink data/a -> b cannot be sent: it loops"):
        collect(proj, ["data"])
    for name in ("a", "b"):
        (proj / "data" / name).unlink()
    (proj / "data" / "gone").symlink_to("missing.bin")
    with pytest.raises(InputError, match="symlink data/gone -> missing.bin cannot be sent: it dangles"):
        collect(proj, ["data"])
    (proj / ".orchignore").write_text("data/gone\n")  # the hint's way out: an ignored link is left out
    assert [d.rule for d in collect(proj, ["train.py", "data"]).left_out] == [".orchignore line 1: data/gone"]


def test_follow_symlinks_must_name_a_link(tmp_path):
    proj = project_with(tmp_path)
    with pytest.raises(InputError, match="follow_symlinks lists 'data', which is not a symlink"):
        collect(proj, ["train.py"], ["data"])


def test_a_link_read_for_its_content_is_what_the_revision_hashes(tmp_path):
    secret, proj = outside_secret(tmp_path), project_with(tmp_path)
    os.symlink(secret, proj / "data" / "shadowlink")
    rev = revisions.build(proj, ["data"], follow_symlinks=["data/shadowlink"])
    import hashlib

    assert rev.files[0]["path"] == "data/shadowlink"
    assert rev.files[0]["sha256"] == hashlib.sha256(secret.read_bytes()).hexdigest()


def test_a_fifo_in_a_named_folder_is_left_out_by_name_never_read(tmp_path):
    proj = project_with(tmp_path)
    os.mkfifo(proj / "data" / "pipe")
    sel = collect(proj, ["train.py", "data"])  # reading the fifo would block forever
    assert [(d.path, d.rule) for d in sel.left_out] == [("data/pipe", "not a regular file: fifo, socket or device")]
    assert "  data/pipe (not a regular file: fifo, socket or device)" in left_out_warning(sel.left_out)


def counted_git(tmp_path: Path, monkeypatch) -> Path:
    """git first on PATH through a shim that adds a line per call to the file returned."""
    calls = tmp_path / "calls"
    shim = tmp_path / "bin"
    shim.mkdir()
    real = shutil.which("git")
    (shim / "git").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real} "$@"\n')
    (shim / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_the_commit_and_a_dirty_tree_come_from_one_git_call(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print(1)\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    calls = counted_git(tmp_path, monkeypatch)
    fresh = revisions.build(repo, ["train.py"])  # no commit yet
    assert fresh.git_commit is None and fresh.git_dirty is None
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    calls.write_text("")
    clean = revisions.build(repo, ["train.py"])
    assert (clean.git_commit, clean.git_dirty, clean.git_diff) == (head, False, None)
    assert len(calls.read_text().splitlines()) == 1  # a clean tree: one git call
    (repo / "train.py").write_text("print(2)\n")
    dirty = revisions.build(repo, ["train.py"])
    assert dirty.git_commit == head and dirty.git_dirty is True and "+print(2)" in dirty.git_diff


def test_git_is_asked_only_where_a_repository_can_be_found(tmp_path, monkeypatch):
    """No ``.git`` in the project's folder or above it (and no GIT_DIR): no git call, the commit None; a worktree's
    ``.git`` file, or GIT_DIR, and git is asked as before."""
    calls = counted_git(tmp_path, monkeypatch)
    monkeypatch.delenv("GIT_DIR", raising=False)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text("print(1)\n")
    assert not revisions.in_repository(plain)  # pytest's folders are in no repository
    rev = revisions.build(plain, ["train.py"])
    assert (rev.git_commit, rev.git_dirty, rev.git_diff) == (None, None, None)
    assert not calls.exists()

    (plain / ".git").write_text("gitdir: /nowhere\n")  # a linked worktree's .git is a file
    assert revisions.in_repository(plain)
    rev = revisions.build(plain, ["train.py"])
    assert rev.git_commit is None  # git was asked, and found no repository there
    assert len(calls.read_text().splitlines()) == 1
    (plain / ".git").unlink()
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere.git"))
    assert revisions.in_repository(plain)
