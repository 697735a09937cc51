"""Studies and the gallery write to an untracked folder (``out/``) unless told ``--out-dir plots``:
a fresh clone's shipped ``plots/`` is unchanged after running every study with ``--quick`` and the
gallery (in a copy of the repository's tracked files, through the command line)."""

import hashlib
import shutil
import subprocess
import sys

import pytest

from sim.commands.study import STUDIES

from conftest import REPO, cli_env


def _clone(dst):
    """The tracked files of this checkout copied to ``dst`` (what a fresh clone holds)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():  # package data linked to the repository's folders
            (dst / name).symlink_to(src.readlink())
        elif src.is_file():
            shutil.copy2(src, dst / name)
    return dst


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _run(args, cwd):
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_gallery_writes_to_out_not_plots(tmp_path):
    clone = _clone(tmp_path)
    before = _digest(clone / "plots")
    _run(["-m", "sim.studies.gallery"], clone)
    assert _digest(clone / "plots") == before
    assert {p.name for p in (clone / "out").iterdir()} >= {"gallery-fsdp-prefetch.png", "gallery-straggler.png"}


@pytest.mark.slow
def test_every_quick_study_leaves_the_shipped_plots_alone(tmp_path):
    clone = _clone(tmp_path)
    before = _digest(clone / "plots")
    for name in sorted(STUDIES):
        out = _run(["-m", "sim", "study", name, "--quick", "--quiet", "--workers", "2"], clone).stdout
        assert f"out/study-{name}.png" in out, out[-500:]
        assert (clone / "out" / f"study-{name}.png").is_file()
    assert _digest(clone / "plots") == before
