"""The tree holds the code this project wrote: another project's files come in as packages, never as copies.

The one exception is a browser asset the dashboard serves offline (uPlot), vendored with its licence beside it.
A copy is recognised by what copied files carry: a licence file of their own, or a copyright or SPDX header.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENDORED = ("orchestrator/ui/static/vendor/",)  # browser assets, each folder with its LICENSE
LICENCE_NAME = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE|AUTHORS)(\.(txt|md|rst))?$", re.IGNORECASE)
HEADER = re.compile(rb"(copyright\s+(\(c\)|\xc2\xa9|\d{4})|SPDX-License-Identifier)", re.IGNORECASE)
TEXT = {".py", ".sh", ".js", ".css", ".html", ".toml", ".cfg", ".c", ".h", ".yml", ".yaml", ".txt", ""}


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # not a checkout (an unpacked sdist): walk the tree
        return [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(REPO).parts)]
    return [name for name in out.decode().split("\0") if name and (REPO / name).is_file()]


def outside_vendor(names: list[str]) -> list[str]:
    return [n for n in names if not n.startswith(VENDORED)]


def test_no_licence_file_but_the_vendored_assets_own():
    found = [n for n in outside_vendor(tracked()) if LICENCE_NAME.match(Path(n).name) and "/" in n]
    assert found == [], f"another project's files in the tree (install them as a package instead): {found}"


def test_no_file_carries_another_projects_copyright_header():
    found = []
    for name in outside_vendor(tracked()):
        if Path(name).suffix not in TEXT or name.startswith("tests/unit/test_own_code.py"):
            continue
        head = b"\n".join((REPO / name).read_bytes().splitlines()[:40])
        if HEADER.search(head):
            found.append(name)
    assert found == [], f"files with a copyright header of another project: {found}"


def test_each_vendored_asset_folder_keeps_its_licence():
    folders = {str(Path(n).parent) for n in tracked() if n.startswith(VENDORED)}
    assert folders, "the dashboard's vendored assets are missing"
    for folder in folders:
        assert (REPO / folder / "LICENSE").is_file(), f"{folder} is vendored without its licence"


def test_the_check_finds_a_copy(tmp_path):
    """The header check is not vacuous: a file as copied projects ship them is caught."""
    copied = b'"""\nCopyright (c) 2022 Someone Else\n"""\nimport os\n'
    assert HEADER.search(copied)
    assert LICENCE_NAME.match("LICENSE") and LICENCE_NAME.match("COPYING.txt") and not LICENCE_NAME.match("license.py")
