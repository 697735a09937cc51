"""Studies and the gallery write to an untracked folder (``out/``) unless told ``--out-dir plots``:
a fresh clone's shipped ``plots/`` is unchanged after running every study with ``--quick`` and the
gallery (in a copy of the repository's tracked files, through the command line). The gallery's
one run here also checks every picture it regenerates (it was a second run in tests/test_timeline.py)."""

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from sim.commands.study import STUDIES

from conftest import REPO, cli_env
import docs_commands
from test_docs import OUT as DOCS_OUT, differences

PNG = b"\x89PNG\r\n\x1a\n"


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


def test_gallery_writes_to_out_not_plots_and_regenerates_every_picture(tmp_path):
    """One run of the gallery (it takes ~30 s of CPU): its pictures go to out/, every picture
    is there, with the step times the hardware picture compares, and it prints what the docs
    store for ``python -m sim.studies.gallery``."""
    clone = _clone(tmp_path)
    before = _digest(clone / "plots")
    p = _run(["-m", "sim.studies.gallery"], clone)
    assert _digest(clone / "plots") == before
    command = "python -m sim.studies.gallery"  # what the docs show it printing (tests/test_docs.py skips it)
    assert command in docs_commands.RUN_ELSEWHERE
    stored = DOCS_OUT / f"{docs_commands.slug(command)}.out"
    if os.environ.get("UPDATE_DOCS"):  # as tests/test_docs.py does for the commands it runs
        stored.write_text(p.stdout)
    bad = differences(stored.read_text(), p.stdout)
    assert not bad, "\n".join(bad[:20])
    for name in ("fsdp-prefetch", "pipeline-schedules", "straggler", "hierarchical", "hardware"):
        assert (clone / "out" / f"gallery-{name}.png").read_bytes()[:8] == PNG
    assert "bubble" in p.stdout and "straggler cost" in p.stdout
    steps = {line.split(":")[0]: float(line.split("step ")[1].split(" ms")[0])
             for line in p.stdout.splitlines() if " SuperPOD: step" in line or "racks: step" in line
             or "cluster: step" in line}
    assert set(steps) == {"H100 SuperPOD", "B200 SuperPOD", "GB200 NVL72 racks", "MI355X cluster"}
    assert steps["GB200 NVL72 racks"] < steps["H100 SuperPOD"] and steps["MI355X cluster"] < steps["H100 SuperPOD"]
    # MLPerf Training v5.0: GB200 NVL72 2.2x Hopper per GPU; a GB200 (2.5 PFLOP/s) ahead of a B200 (2.25)
    assert steps["GB200 NVL72 racks"] < steps["B200 SuperPOD"] < steps["H100 SuperPOD"] / 1.8


@pytest.mark.slow
def test_every_quick_study_leaves_the_shipped_plots_alone(tmp_path):
    clone = _clone(tmp_path)
    before = _digest(clone / "plots")
    for name in sorted(STUDIES):
        out = _run(["-m", "sim", "study", name, "--quick", "--quiet", "--workers", "2"], clone).stdout
        assert f"out/study-{name}.png" in out, out[-500:]
        assert (clone / "out" / f"study-{name}.png").is_file()
    assert _digest(clone / "plots") == before
