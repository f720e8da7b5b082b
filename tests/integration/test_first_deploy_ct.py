"""A training script as its authors wrote it, deployed to a CT the way a new user would, first time.

The project has nanoGPT's shape: its real ``.gitignore`` (``*.bin``, ``*.pkl``), data prepared into
``data/shakespeare_char/``, a ``config/`` file and ``--key=value`` overrides on the command line, a local
``model.py`` it imports, an ``out_dir`` it writes, and nanoGPT's own log line
(``iter N: loss X, time Yms, mfu Z%``). The user names the data in ``sources``, writes the command line as they
would type it (``$ORCH_CHECKPOINT_DIR``, ``&&``) and types the README's sequence: ``deploy --ct 200 --wait``,
then bare ``status``, ``logs --metrics``, ``restart --clean-checkpoints``, ``logs --follow``.
"""

from __future__ import annotations

import json
import pickle

import pytest

from tests.integration.test_remote import CKPT, ROOT, RemoteProject, on_ct, wait_state
from tests.unit.test_sources import NANOGPT_GITIGNORE

pytestmark = pytest.mark.testbed

# nanoGPT's train.py in miniature: configurator.py's way of reading a config file and --key=value overrides,
# a model from model.py beside it, the data files read by relative path, its log line, a checkpoint in out_dir
TRAIN = """\
import os, pickle, sys, time
from model import TinyModel
max_iters, out_dir, log_interval = 20, "out", 5
for arg in sys.argv[1:]:
    if "=" not in arg:
        exec(open(arg).read())
    else:
        key, val = arg[2:].split("=", 1)
        globals()[key] = type(globals()[key])(val) if key in globals() else val
meta = pickle.load(open(os.path.join("data", "shakespeare_char", "meta.pkl"), "rb"))
data = open(os.path.join("data", "shakespeare_char", "train.bin"), "rb").read()
model = TinyModel(meta["vocab_size"], len(data))
os.makedirs(out_dir, exist_ok=True)
print(f"tokens per iteration will be: {len(data):,}")
for iter_num in range(max_iters):
    t0 = time.time()
    lossf = model.step(iter_num)
    time.sleep(0.05)
    dt = time.time() - t0
    if iter_num % log_interval == 0:
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {-100.0:.2f}%")
with open(os.path.join(out_dir, "ckpt.pt"), "w") as fh:
    fh.write(str(iter_num))
print(f"saving checkpoint to {out_dir}")
"""
MODEL = """\
class TinyModel:
    def __init__(self, vocab_size, n):
        self.vocab_size, self.n = vocab_size, n

    def step(self, i):
        return 4.2 - 0.1 * i
"""
CONFIG = "max_iters = 30\nlog_interval = 5\n"
COMMAND = ("python3 train.py config/train_tiny.py --out_dir=$ORCH_CHECKPOINT_DIR/tiny --max_iters=40 "
           "&& echo training done")


@pytest.fixture
def nanogpt_like(testbed, tmp_path, monkeypatch, ct200):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", testbed.api.token_secret)
    path = tmp_path / "nanogpt"
    data = path / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    (path / "config").mkdir()
    (path / ".gitignore").write_text(NANOGPT_GITIGNORE)
    (path / "train.py").write_text(TRAIN)
    (path / "model.py").write_text(MODEL)
    (path / "config" / "train_tiny.py").write_text(CONFIG)
    (data / "train.bin").write_bytes(bytes(range(65)) * 3000)
    (data / "val.bin").write_bytes(bytes(range(65)) * 300)
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65}))
    proj = RemoteProject(path, testbed)
    proj.write(sources='["train.py", "model.py", "config", "data/shakespeare_char/train.bin", '
                       '"data/shakespeare_char/meta.pkl"]', entries=False,
               )
    text = (path / "orch.toml").read_text().replace('command = "python3 train.py"', f"command = {json.dumps(COMMAND)}")
    (path / "orch.toml").write_text(text)
    return proj


def test_a_nanogpt_shaped_project_trains_on_a_ct_the_first_time(nanogpt_like, testbed):
    proj = nanogpt_like
    # the whole data folder named instead: .gitignore's *.bin and *.pkl leave them out, and the dry run says so
    dry = proj.run("deploy", "--ct", "200", "--dry-run", "--set",
                   "project.sources=['train.py', 'model.py', 'config', 'data']")
    assert dry.returncode == 0, dry.stderr
    assert "data/shakespeare_char/train.bin (.gitignore line" in dry.stderr and "*.bin" in dry.stderr, dry.stderr
    assert "!" in dry.stderr  # how to include them

    res = proj.run("deploy", "--ct", "200", "--wait=90", "-m", "first try")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "iter 0: loss 4.2000" in res.stdout + res.stderr  # --wait returned at nanoGPT's first log line
    status = proj.run("status", "--json")
    assert status.returncode == 0, status.stderr
    wait_state(proj, [], ("finished",))
    with proj.registry() as reg:
        [exp] = reg.list()
    assert exp.status == "finished" and exp.exit_code == 0
    logs = proj.run("logs", "-n", "50")
    assert "training done" in logs.stdout and "tokens per iteration will be: 195,000" in logs.stdout
    assert "iter 35: loss 0.7000" in logs.stdout  # --max_iters=40 from the command line won over the config file
    assert on_ct(testbed, 200, "cat", f"{CKPT}/tiny/ckpt.pt") == "39"  # $ORCH_CHECKPOINT_DIR expanded on the CT
    metrics = proj.run("logs", "--metrics")
    assert metrics.returncode == 0 and "4.2" in metrics.stdout and "35" in metrics.stdout, metrics.stdout
    shown = json.loads(proj.run("status", "--json").stdout)
    assert shown["summary"]["step"] == 35 and shown["summary"]["loss"] == pytest.approx(0.7)
    # the revision is what was pushed: the import's bytecode went to the run's work folder, not into it
    rev = f"{ROOT}/revisions/{exp.revision}"
    listed = on_ct(testbed, 200, "find", rev, "-type", "f").split()
    assert sorted(p[len(rev) + 1:] for p in listed) == sorted(
        [".orch-manifest.json", "train.py", "model.py", "config/train_tiny.py", "data/shakespeare_char/train.bin",
         "data/shakespeare_char/meta.pkl"])
    work = f"{ROOT}/runs/{proj.run_key(exp.id)}/work"
    assert "model" in on_ct(testbed, 200, "ls", f"{work}/__pycache__")

    # bare commands act on CT 200 now: a restart that moves the checkpoints aside, then its log followed to the end
    again = proj.run("restart", "--clean-checkpoints", "--yes")
    assert again.returncode == 0, again.stderr
    follow = proj.run("logs", "--follow", timeout=120)
    assert follow.returncode == 0 and "training done" in follow.stdout, follow.stdout + follow.stderr
    with proj.registry() as reg:
        first, second = sorted(reg.list(), key=lambda e: e.id)
    assert second.parent == first.id and second.checkpoints_action == "moved"
    assert on_ct(testbed, 200, "cat", f"{CKPT}/tiny/ckpt.pt") == "39"  # the restart wrote its own again
