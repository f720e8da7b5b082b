"""``orch init`` reads the project it starts (the real CLI as a subprocess and on a real pseudo-terminal, real git,
a real run on the local target): the entry point it runs, the requirements it suggests, the folders .gitignore
leaves out, and .orch/ and orch-pull/ kept out of git; no [batching] is written or recorded unless asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.launch import starter
from tests.conftest import run_on_pty

ORCH = os.path.join(os.path.dirname(sys.executable), "orch")
MAIN = "import os\nif __name__ == '__main__':\n    print('step=1 loss=0.5', flush=True)\n" \
       "    open(os.path.join(os.environ['ORCH_RUN_DIR'], 'ran'), 'w').write(__file__)\n"


def orch(folder: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, ORCH_WARM="0", XDG_DATA_HOME=str(folder.parent / "data"))
    return subprocess.run([ORCH, *args], cwd=folder, capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git project whose entry point is main.py, with requirements and a data folder git ignores."""
    path = tmp_path / "proj"
    (path / "data").mkdir(parents=True)
    (path / "main.py").write_text(MAIN)
    (path / "model.py").write_text("WIDTH = 8\n")
    (path / "requirements.txt").write_text("numpy\n")
    (path / "data" / "train.bin").write_bytes(b"\0" * 64)
    (path / ".gitignore").write_text("data/\n*.log")  # no newline at its end
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_init_runs_main_py_sends_it_and_keeps_orchs_folders_out_of_git(repo):
    made = orch(repo, "init")
    assert made.returncode == 0, made.stderr
    assert "runs main.py" in made.stdout and "added .orch/ and orch-pull/ to .gitignore" in made.stdout
    assert "not sent: data/ (.gitignore line 1: data/); add the line !data/ to .orchignore" in made.stdout
    assert (repo / ".gitignore").read_text().splitlines()[:2] == ["data/", "*.log"]
    assert {".orch/", "orch-pull/"} <= set((repo / ".gitignore").read_text().splitlines())
    settings = load_settings(repo / "orch.toml", env={})
    assert (settings.project.command, settings.project.sources) == ("python3 main.py", ["."])
    text = (repo / "orch.toml").read_text()
    assert '# requirements = "requirements.txt"' in text and "\n[batching]" not in text
    assert "it ignores [paths]" in text

    ran = orch(repo, "deploy", "--wait", "60", "-m", "first")
    assert ran.returncode == 0, ran.stderr
    shown = json.loads(orch(repo, "experiments", "show", "1", "--json").stdout)
    assert shown["batching"] == {} and "batching" not in shown["config"]  # none read, none recorded
    ran = [p.read_text() for p in (repo.parent / "data").rglob("runs/*/ran")]
    assert len(ran) == 1 and ran[0].endswith("main.py")  # the revision held main.py, and it ran
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert ".orch/" not in status and "main.py" in status and "data/" not in status

    assert {"path": "data/", "rule": ".gitignore line 1: data/"} in \
        json.loads(orch(repo, "deploy", "--dry-run", "--json").stdout)["left_out"]
    (repo / ".orchignore").write_text("!data/\n")  # the line init named sends the folder
    plan = json.loads(orch(repo, "deploy", "--dry-run", "--json").stdout)
    assert "data/" not in str(plan["left_out"]) and plan["revision"] != shown["revision"]


@pytest.mark.parametrize("answer, added", [("n", False), ("y", True)])
def test_on_a_terminal_init_asks_before_it_touches_gitignore(repo, answer, added):
    before = (repo / ".gitignore").read_text()
    env = {"ORCH_WARM": "0", "XDG_DATA_HOME": str(repo.parent / "data")}
    code, seen = run_on_pty([ORCH, "init"], repo, {"add .orch/ and orch-pull/ to .gitignore": answer}, env=env)
    assert code == 0, seen
    assert "add .orch/ and orch-pull/ to .gitignore (orch's registry and pulled files)? [Y/n]" in seen
    after = (repo / ".gitignore").read_text()
    if added:
        assert after.startswith(before + "\n") and after.endswith(".orch/\norch-pull/\n")
    else:
        assert after == before and "left .gitignore alone" in seen


def test_a_gitignore_that_covers_them_already_is_left_alone(repo):
    (repo / ".gitignore").write_text(".orch\n/orch-pull\n")
    made = orch(repo, "init")
    assert made.returncode == 0 and ".gitignore" not in made.stdout
    assert (repo / ".gitignore").read_text() == ".orch\n/orch-pull\n"


def test_the_entry_point_comes_from_pyproject_scripts_or_the_one_guarded_script(tmp_path):
    src = tmp_path / "pkg" / "src" / "tinylm"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "cli.py").write_text("def main():\n    print('step=1 loss=1', flush=True)\n    return 0\n")
    (tmp_path / "pkg" / "pyproject.toml").write_text('[project]\nname = "tinylm"\ndependencies = ["numpy"]\n'
                                                   '[project.scripts]\ntinylm = "tinylm.cli:main"\n')
    found = starter.survey(tmp_path / "pkg")
    assert found.command == ["python3", "-c", "import sys; from tinylm.cli import main; sys.exit(main())"]
    assert found.env == {"PYTHONPATH": "src"} and found.requirements == ("pyproject", "true")
    assert not found.git  # not a git project: .gitignore is not touched
    run = subprocess.run(found.command, cwd=tmp_path / "pkg", capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH="src"))
    assert run.returncode == 0 and "step=1" in run.stdout  # the command runs the script's function

    one = tmp_path / "one"
    one.mkdir()
    (one / "finetune.py").write_text('if __name__ == "__main__":\n    pass\n')
    (one / "utils.py").write_text("X = 1\n")
    assert starter.survey(one).command == "python3 finetune.py"
    (one / "eval.py").write_text("if __name__ == '__main__':\n    pass\n")
    two = starter.survey(one)
    assert two.command is None and two.candidates == ["python3 finetune.py", "python3 eval.py"]
    text = starter.starter(two, name="one", batching=True)
    assert '# command = "python3 finetune.py"\n# command = "python3 eval.py"\n' in text
    assert "\ncommand" not in text and "\nenv" not in text  # unset; no thread cap nobody asked for
    (one / "eval.py").unlink()
    (one / "tools").mkdir()
    (one / "tools" / "prep.py").write_text("if __name__ == '__main__':\n    pass\n")
    assert starter.survey(one).command == "python3 finetune.py"  # the top folder's one script beats a deeper one
    (one / "README.md").write_text("First `python tools/prep.py`, then train.\n")
    assert starter.survey(one).candidates == ["python3 tools/prep.py", "python3 finetune.py"]  # unless a README
    settings = load_settings(_write(one, text), env={})
    assert settings.batching.strategy == "megabatch" and "batching" in settings.model_fields_set


def _write(folder: Path, text: str) -> Path:
    (folder / "orch.toml").write_text(text)
    return folder / "orch.toml"


def _mingpt(path: Path) -> Path:
    """A folder laid out as karpathy/minGPT: a package, its scripts only in subfolders, a README, no train.py."""
    files = {
        "mingpt/__init__.py": "",
        "mingpt/model.py": "class GPT:\n    pass\n",
        "mingpt/trainer.py": "class Trainer:\n    pass\n",
        "mingpt/bpe.py": "def encode(s):\n    return s\n\nif __name__ == '__main__':\n    print(encode('hi'))\n",
        "projects/chargpt/chargpt.py": "from mingpt.model import GPT\n\nif __name__ == '__main__':\n"
                                       "    print('iter 0: train loss 4.17', flush=True)\n",
        "projects/adder/adder.py": "from mingpt.model import GPT\n\nif __name__ == '__main__':\n    pass\n",
        "projects/readme.md": "small projects built on minGPT\n",
        "README.md": "# minGPT\n\n    cd projects/chargpt\n    python chargpt.py\n",
        "setup.py": "from setuptools import setup\nsetup(name='minGPT', packages=['mingpt'])\n",
        ".gitignore": "__pycache__/\n",
    }
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_init_in_a_mingpt_shaped_repository_proposes_its_scripts_and_a_deploy_refuses_until_one_is_chosen(tmp_path):
    repo = _mingpt(tmp_path / "minGPT")
    made = orch(repo, "init")
    assert made.returncode == 0, made.stderr
    shown = made.stdout.splitlines()
    assert "  python3 projects/chargpt/chargpt.py" in shown and "  python3 projects/adder/adder.py" in shown
    # the README runs chargpt: it comes first; a library module's demo (a package's bpe.py) comes after the projects
    assert shown.index("  python3 projects/chargpt/chargpt.py") < shown.index("  python3 mingpt/bpe.py")
    text = (repo / "orch.toml").read_text()
    assert '\n# command = "python3 projects/chargpt/chargpt.py"\n' in text and "\ncommand" not in text
    assert "OMP_NUM_THREADS" not in load_settings(repo / "orch.toml", env={}).project.env

    for dry in (["--dry-run"], []):
        refused = orch(repo, "deploy", *dry)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "error: [project] command is not set, and orch's default 'python3 train.py' runs train.py, which is " \
               "not among the" in refused.stderr
        assert "hint: set [project] command in orch.toml" in refused.stderr
        assert "python3 projects/chargpt/chargpt.py" in refused.stderr
    assert not (repo / ".orch" / "experiments.db").exists()  # nothing recorded
    assert not list((tmp_path / "data").rglob("runs/*"))  # nothing started

    # the line init proposed, uncommented, runs
    (repo / "orch.toml").write_text(text.replace('# command = "python3 projects/chargpt/chargpt.py"',
                                                 'command = "python3 projects/chargpt/chargpt.py"\n'
                                                 'env = { PYTHONPATH = "." }'))
    ran = orch(repo, "deploy", "--wait", "60")
    assert ran.returncode == 0 and "first metrics" in ran.stdout, ran.stdout + ran.stderr
