"""What reaches a real CT: data that nanoGPT's .gitignore drops and `!*.bin` in .orchignore re-includes, and a
symlink to a controller file outside the project, refused (nothing of it on the CT) unless follow_symlinks lists it.

The real CLI over real SSH into CT 200, the Proxmox API stand-in, the run reading its data on the CT.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.integration.test_remote import ROOT, RemoteProject, on_ct
from tests.unit.test_sources import NANOGPT_GITIGNORE

pytestmark = pytest.mark.testbed

MARK = b"orch-test-controller-only-5f3c"
TRAIN = """\
import hashlib, time
data = open("data/shakespeare_char/train.bin", "rb").read()
print(f"step=1 loss=1.0 train_bin={hashlib.sha256(data).hexdigest()}", flush=True)
time.sleep(60)
"""


@pytest.fixture
def nanogpt(testbed, tmp_path, monkeypatch, ct200):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", testbed.api.token_secret)
    path = tmp_path / "proj"
    data = path / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    (path / ".gitignore").write_text(NANOGPT_GITIGNORE)
    (path / "train.py").write_text(TRAIN)
    (data / "train.bin").write_bytes(bytes(range(256)) * 4096)
    (data / "meta.pkl").write_bytes(b"vocab")
    secret = tmp_path / "outside" / "shadow"
    secret.parent.mkdir()
    secret.write_bytes(MARK + b":$6$hash\n")
    (data / "shadowlink").symlink_to(secret)
    proj = RemoteProject(path, testbed)
    return proj, secret


def holding_mark(testbed) -> str:
    return on_ct(testbed, 200, "sh", "-c", f"grep -rl {MARK.decode()} {ROOT} 2>/dev/null || true").strip()


def test_reincluded_data_reaches_the_ct_and_an_outside_link_never_does_unless_allowed(nanogpt, testbed):
    proj, secret = nanogpt
    proj.write(sources='["train.py", "data"]', extra="")
    (proj.path / ".orchignore").write_text("!*.bin\n")
    res = proj.cli("deploy", "--ct", "200")
    assert res.exit_code == 2, res.output
    assert f"error: symlink data/shakespeare_char/shadowlink -> {secret} points outside the project" in res.stderr
    assert proj.rows() == [] and holding_mark(testbed) == ""

    text = (proj.path / "orch.toml").read_text()
    (proj.path / "orch.toml").write_text(text.replace('sources = ["train.py", "data"]',
                                                      'sources = ["train.py", "data"]\n'
                                                      'follow_symlinks = ["data/shakespeare_char/shadowlink"]'))
    res = proj.cli("deploy", "--ct", "200", "--wait=60", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    want = hashlib.sha256(bytes(range(256)) * 4096).hexdigest()
    assert out["waited"]["metric"] and f"train_bin={want}" in out["waited"]["line"]  # the run read it on the CT
    assert "data/shakespeare_char/meta.pkl (.gitignore line 15: meta.pkl)" in res.stderr
    folder = f"{ROOT}/revisions/{out['experiment']['revision']}/data/shakespeare_char"
    assert on_ct(testbed, 200, "cat", f"{folder}/shadowlink").encode() == secret.read_bytes()
    assert on_ct(testbed, 200, "sh", "-c", f"test -L {folder}/shadowlink || echo regular").strip() == "regular"
    assert on_ct(testbed, 200, "ls", folder).split() == ["shadowlink", "train.bin"]  # meta.pkl left out
    assert proj.cli("stop", "--ct", "200").exit_code == 0
