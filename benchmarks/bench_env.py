"""The run's environment ([env]) on the local target: a first build from pushed wheels, and what a deploy that
reuses the env costs against the same deploy without [env].

The requirements are about 20 packages (a few with compiled wheels); their wheels are downloaded from the
package index once, into the benchmark's folder, and orch resolves from there (PIP_NO_INDEX, PIP_FIND_LINKS).
Builds are timed with uv (pushed to the target) and with venv + pip. Deploys of a code change alone alternate
between a project with [env] and one without, so both see the same machine; prints medians and the ratio,
asserts nothing about time.
Run: python benchmarks/bench_env.py [--runs R]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REQUIREMENTS = """\
requests==2.32.3
urllib3==2.2.3
idna==3.10
certifi==2024.8.30
charset-normalizer==3.4.0
attrs==24.2.0
six==1.16.0
tomli==2.0.1
packaging==24.1
click==8.1.7
jinja2==3.1.4
markupsafe==3.0.2
pyyaml==6.0.2
python-dateutil==2.9.0.post0
pytz==2024.2
tqdm==4.66.5
typing-extensions==4.12.2
pluggy==1.5.0
iniconfig==2.0.0
filelock==3.16.1
platformdirs==4.3.6
"""


def orch(work: Path, *args: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                         text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed: {out.stderr}")
    return json.loads(out.stdout) if "--json" in args else {}


def project(work: Path, name: str, with_env: bool, installer: str = "auto") -> Path:
    path = work / name
    path.mkdir()
    (path / "train.py").write_text("import time\ntime.sleep(600)\n")
    (path / "requirements.txt").write_text(REQUIREMENTS)
    root = work / f"target-{name}"
    env = f'[env]\nrequirements = "requirements.txt"\nwheels = "push"\ninstaller = "{installer}"\n' if with_env else ""
    (path / "orch.toml").write_text(
        f'[project]\nname = "{name}"\nsources = ["train.py"]\ncommand = "python3 train.py"\n'
        f'[run]\nstop_timeout = 2\n[targets.local]\nkind = "local"\nroot = "{root}"\n'
        f'checkpoints = "{root}/checkpoints"\n{env}')
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-env-"))
    wheels = work / "wheels"
    req = work / "requirements.txt"
    req.write_text(REQUIREMENTS)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(wheels),
                    "-r", str(req)], check=True)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), XDG_CACHE_HOME=str(work / "cache"))
    n_wheels = len(list(wheels.iterdir()))
    builds = []
    for installer in ("uv", "pip"):
        path = project(work, f"build-{installer}", True, installer="auto" if installer == "uv" else "pip")
        t = time.perf_counter()
        got = orch(path, "env", "build", "--json", env=env)["built"][0]
        builds.append((installer, (time.perf_counter() - t) * 1000, got["seconds"], got["packages"]))
    with_env, without = project(work, "with-env", True), project(work, "without-env", False)
    orch(with_env, "deploy", env=env)  # builds the env once
    orch(without, "deploy", env=env)
    times: dict = {"with": [], "without": []}
    for i in range(a.runs):
        for key, path in (("with", with_env), ("without", without)):
            (path / "train.py").write_text(f"import time\n# {i} {time.time()}\ntime.sleep(600)\n")
            t = time.perf_counter()
            res = orch(path, "deploy", "--json", env=env)
            times[key].append((time.perf_counter() - t) * 1000)
            assert key == "without" or res["experiment"]["env"]["hash"]
    print(f"first build: {REQUIREMENTS.count(chr(10))} requirements, {n_wheels} wheels pushed to the local target")
    print(f"{'installer':10} {'orch env build ms':>18} {'build s (target)':>17} {'packages':>9}")
    for installer, ms, seconds, packages in builds:
        print(f"{installer:10} {ms:18.0f} {seconds:17.2f} {packages:9d}")
    base = statistics.median(times["without"])
    mine = statistics.median(times["with"])
    print(f"\ndeploy of a code change, medians of {a.runs} runs (alternating)")
    print(f"{'deploy':34} {'ms':>8} {'x without':>10}")
    print(f"{'without [env]':34} {base:8.0f} {1.0:10.2f}")
    print(f"{'with [env], env reused':34} {mine:8.0f} {mine / base:10.2f}")
    print("bar: the reused env costs at most 1.1x the deploy without [env]")
    orch(with_env, "stop", env=env)
    orch(without, "stop", env=env)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
