"""The wheel a user gets from ``pip install clustersim`` (issue 20): built from this
checkout, installed into a fresh virtual environment, run from a folder outside the
checkout. Catches data files that are not package data (topologies, validation tables,
study, gallery and example scenarios) and code that finds files through the repository.

The fresh environment sees this environment's site-packages through a ``.pth`` file for
the dependencies (numpy, pandas ...: no download), but clustersim itself only from the
wheel, which the test checks. Run: ``python -m pytest tests/test_wheel.py`` (~30 s).
"""

import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from conftest import REPO
import sim
from sim.commands.study import STUDIES


def data_files() -> set[str]:
    """Every file under sim/ that is not Python source, as a wheel names it (links followed:
    sim/examples is the repository's scenarios/)."""
    out = set()
    for folder, dirs, files in os.walk(REPO / "sim", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if not name.endswith((".py", ".pyc")):
                out.add((Path(folder) / name).relative_to(REPO).as_posix())
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, the fresh environment's bin folder, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("sim", "scenarios", "topologies"):  # sim/examples and sim/hardware/topologies link to the others
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(src)], capture_output=True,
                           text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp / "dist").glob("clustersim-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "outer-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", "--ignore-installed",
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return wheel, venv / "bin", elsewhere


def run(installed, *args: str) -> subprocess.CompletedProcess:
    _, bin_dir, cwd = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CLUSTERSIM_DEBUG")}
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_wheel_holds_every_data_file(installed):
    names = set(zipfile.ZipFile(installed[0]).namelist())
    missing = data_files() - names
    assert not missing, f"not package data: {sorted(missing)}"
    assert {"sim/data/published_runs.csv", "sim/hardware/topologies/dgx-h100.toml",
            "sim/examples/llama3-8b-fsdp-h100.toml", "sim/studies/scenarios/fsdp-crossover.toml",
            "sim/studies/gallery_scenarios/pipeline.toml"} <= names


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    proc = run(installed, "python", "-c", "import sim, importlib.metadata as m; print(sim.__file__); "
                                          "print(m.version('clustersim'))")
    where, version = proc.stdout.split()
    assert proc.returncode == 0 and Path(where).is_relative_to(installed[1].parent) and REPO.as_posix() not in where
    assert version == sim.__version__
    assert run(installed, "clustersim", "--version").stdout.strip() == f"clustersim {version}"


def test_a_bundled_example_runs_by_name_outside_the_checkout(installed):
    proc = run(installed, "clustersim", "run", "llama3-8b-fsdp-h100", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    want = sim.simulate(sim.load_scenario(REPO / "scenarios/llama3-8b-fsdp-h100.toml")).summary
    got.pop("sim_wall_s"), want.pop("sim_wall_s")
    assert json.dumps(got) == json.dumps(want)


def test_validate_runs_from_the_shipped_tables(installed):
    proc = run(installed, "clustersim", "validate", "--rows", "MH", "--no-pp", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["id"] for r in rows] == ["MH-1.7B-48", "MH-16B-192"] and all(abs(r["error"]) < 0.2 for r in rows)


def test_study_and_gallery_scenarios_load_from_the_wheel(installed):
    code = ("from sim.studies.base import scenario_path; from sim.studies.gallery import SCENARIOS; "
            "from sim.input.load import load_scenario; import sys; "
            "[load_scenario(scenario_path(n)) for n in sys.argv[1:]]; "
            "print(len([load_scenario(p) for p in sorted(SCENARIOS.glob('*.toml'))]))")
    proc = run(installed, "python", "-c", code, *STUDIES)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == len(list((REPO / "sim/studies/gallery_scenarios").glob("*.toml"))) == 5  # + dualpipe, hardware


def test_topologies_load_by_name_and_by_their_repository_path_from_the_wheel(installed):
    code = ("from sim.hardware.specs import load_spec; "
            "print(load_spec('gb200-nvl72') == load_spec('topologies/gb200-nvl72.toml'), load_spec('generic').name)")
    proc = run(installed, "python", "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "generic"]
