"""Output paths and the command line a new user meets (issue 20): a hostile scenario name
never writes outside the output folder; output flags refuse missing folders, directories
and wrong suffixes before simulating and create no folders; ``--version``, ``clustersim``
alone, plain-text help, bundled examples by name, the text summary, progress lines.

Run: ``python -m pytest tests/test_cli_outputs.py``
"""

from pathlib import Path
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, assert_input_error, cli_env, clustersim
import sim
from sim.errors import InputError
from sim.input.bundled import example_names
from sim.outputs.paths import file_in, output_dir, output_file, safe_name
from sim.outputs.progress import Progress
from sim.units import format_duration

STRAGGLER = REPO / "scenarios/straggler-dp.toml"  # 16 GPUs, a fraction of a second


def cli_in(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m sim ARGS`` run from ``cwd``."""
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, env=cli_env(), capture_output=True,
                          text=True, timeout=300)


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- names and paths
@pytest.mark.parametrize("name, want", [("../../x", "x"), ("/etc/passwd", "etc-passwd"), ("a/../../b", "a-b"),
                                        ("..", "scenario"), ("", "scenario"), ("GPT 3 (175B)", "GPT-3-175B"),
                                        (".hidden", "hidden"), ("a\x00b\nc", "a-b-c"), ("x" * 500, "x" * 120)])
def test_safe_names_are_plain_file_names(name, want):
    assert safe_name(name) == want
    assert file_in(Path("plots"), name, ".png").parent == Path("plots")


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/clustersim-escaped-abs"])
def test_a_hostile_name_never_writes_outside_the_output_folder(tmp_path, name):
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    scenario = work / "s.toml"
    scenario.write_text(STRAGGLER.read_text().replace('name = "straggler-dp"', f"name = {name!r}"))
    proc = cli_in(work, "plot", "s.toml")
    assert proc.returncode == 0, proc.stderr
    written = files_under(tmp_path) - {scenario}
    assert written == {work / "plots" / f"{safe_name(name)}.png"}
    assert not Path("/tmp/clustersim-escaped-abs.png").exists()


@pytest.mark.parametrize("flag, value, key", [
    ("--trace", "missing/dir/t.json", "--trace"), ("--timeline", "missing/t.png", "--timeline"),
    ("--spans", "missing/s.csv", "--spans"), ("--trace", ".", "--trace"), ("--spans", "s.txt", "--spans"),
])
def test_run_output_flags_fail_before_simulating_and_create_no_folder(tmp_path, flag, value, key):
    proc = cli_in(tmp_path, "run", str(STRAGGLER), flag, value)
    assert_input_error(proc, key)
    assert proc.stdout == ""  # nothing simulated: the summary would be printed before the exports
    assert not (tmp_path / "missing").exists() and files_under(tmp_path) == set()


def test_a_directory_given_as_a_file_is_refused(tmp_path):
    (tmp_path / "t.json").mkdir()
    assert_input_error(cli_in(tmp_path, "run", str(STRAGGLER), "--trace", "t.json"), "--trace")


def test_sweep_study_plot_and_gallery_refuse_missing_folders(tmp_path):
    grid = ("--grid", "training.seq_len=2048")
    assert_input_error(cli_in(tmp_path, "sweep", str(STRAGGLER), *grid, "--out", "no/such/x.csv"), "--out")
    assert_input_error(cli_in(tmp_path, "plot", str(STRAGGLER), "-o", "no/such/x.png"), "--out")
    assert_input_error(cli_in(tmp_path, "study", "pipeline-bubbles", "--quick", "--out-dir", "no/such"), "--out-dir")
    gallery = subprocess.run([sys.executable, "-m", "sim.studies.gallery", "--out", "no/such"], cwd=tmp_path,
                             env=cli_env(), capture_output=True, text=True, timeout=120)
    assert_input_error(gallery, "--out")
    assert list(tmp_path.iterdir()) == []


def test_path_helpers(tmp_path):
    assert output_file(tmp_path / "a.png", "-o", (".png",)) == tmp_path / "a.png"
    for bad in (tmp_path / "a.jpg", tmp_path / "x" / "a.png", tmp_path):
        with pytest.raises(InputError, match="^-o: "):
            output_file(bad, "-o", (".png",))
    assert output_dir(tmp_path / "new", "--out-dir") == tmp_path / "new" and not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("")
    for bad in (tmp_path / "a" / "b", tmp_path / "file"):
        with pytest.raises(InputError, match="^--out-dir: "):
            output_dir(bad, "--out-dir")


# ---------------------------------------------------------------- the command line
def test_version_matches_the_package():
    proc = clustersim("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"clustersim {sim.__version__}"


def test_no_subcommand_prints_usage_and_every_subcommand():
    proc = clustersim()
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("usage: clustersim")
    for command in ("run", "collective", "validate", "sweep", "plot", "study", "numerics", "routing"):
        assert f"\n    {command} " in proc.stderr or f"\n    {command}\n" in proc.stderr


@pytest.mark.parametrize("args", [["-h"], ["run", "-h"], ["sweep", "-h"], ["study", "-h"], ["numerics", "-h"]])
def test_help_is_plain_text(args):
    proc = clustersim(*args)
    assert proc.returncode == 0
    assert "``" not in proc.stdout and ":mod:" not in proc.stdout and ":func:" not in proc.stdout
    if args[0] != "-h":  # a subcommand's help opens with what it does
        assert proc.stdout.split("\n\n")[1].strip()


def test_a_bundled_example_runs_by_name_and_an_unknown_name_lists_them(tmp_path):
    assert "llama3-8b-fsdp-h100" in example_names()
    ok = cli_in(tmp_path, "run", "straggler-dp", "--json")
    assert ok.returncode == 0, ok.stderr
    bad = cli_in(tmp_path, "run", "no-such-example")
    assert_input_error(bad, "scenario")
    assert "no such file: no-such-example" in bad.stderr and "llama3-8b-fsdp-h100" in bad.stderr


def test_the_text_summary_shows_gpu_layout_and_units():
    proc = clustersim("run", "scenarios/gpt-1.7b-ptd-interleaved-a100.toml")
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split("  ", 1) for line in proc.stdout.splitlines())
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    s = sim.simulate(sim.load_scenario(REPO / "scenarios/gpt-1.7b-ptd-interleaved-a100.toml")).summary
    p = sim.load_scenario(REPO / "scenarios/gpt-1.7b-ptd-interleaved-a100.toml").parallel
    assert rows["GPUs"] == f"{s['num_gpus']} x a100-80gb"
    assert rows["layout"] == f"tp {p.tp} x pp {p.pp} x dp {p.dp} x cp {p.cp}, ep {p.ep}, zero {p.zero}"
    assert rows["schedule"].startswith(f"interleaved, {p.virtual_stages} virtual stages, ")
    assert rows["step time"] == format_duration(s["step_time_s"])
    assert rows["memory per GPU"] == f"{s['memory_per_gpu_bytes'] / 2**30:.1f} GiB of 80.0 GiB"


def test_without_a_pipeline_the_schedule_line_says_so():
    proc = clustersim("run", "scenarios/llama3-8b-fsdp-h100.toml")
    assert "schedule           no pipeline, 1 micro-batch of 1 sequence per step\n" in proc.stdout
    assert "GPUs               64 x h100-sxm\n" in proc.stdout


def test_durations_read_in_the_unit_that_fits():
    assert [format_duration(t) for t in (0.0004, 0.8875, 9.84, 119.99, 1078.3422)] == \
        ["0.4 ms", "887.5 ms", "9.84 s", "119.99 s", "17.97 min"]


def test_plain_progress_lines_go_to_stderr_only(capsys):
    with Progress("validate", 3, every=0) as progress:
        for note in ("a", "b", "c"):
            progress.advance(note)
    out, err = capsys.readouterr()
    assert out == "" and [line.split(",")[0] for line in err.splitlines()] == \
        ["validate: 1/3 (a)", "validate: 2/3 (b)", "validate: 3/3 (c)"]
    with Progress("validate", 3, quiet=True) as progress:
        progress.advance("a")
    assert capsys.readouterr() == ("", "")


def test_validate_shows_progress_on_stderr(tmp_path):
    env = {**cli_env(), "CLUSTERSIM_PROGRESS_EVERY": "0"}
    proc = subprocess.run([sys.executable, "-m", "sim", "validate", "--rows", "MH", "--no-pp", "--json"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("validate: 2/2 (MH-16B-192)")


def test_every_bundled_example_resolves_by_name_even_with_dots():
    """llama3.1-70b-fp8-h100 has a dot: it is part of the name, not a file suffix."""
    from sim.input.bundled import EXAMPLES, scenario_file

    assert any("." in n for n in example_names())
    for name in example_names():
        assert scenario_file(name) == EXAMPLES / f"{name}.toml"


def test_run_shows_it_is_alive_on_a_non_terminal_stderr():
    """README: long commands show progress on stderr, a line every few seconds when it is no
    terminal (a log, CI); stdout keeps the one JSON object."""
    env = {**cli_env(), "CLUSTERSIM_PROGRESS_EVERY": "0.1"}
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "scenarios/gpt-1.7b-ptd-interleaved-a100.toml",
                           "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    lines = proc.stderr.splitlines()
    assert lines and all(re.fullmatch(r"simulating gpt-1\.7b-ptd-interleaved-a100 on 16 GPUs: \d+ s", x) for x in lines)


@pytest.mark.parametrize("command", [
    ["run", "scenarios/llama3-8b-fsdp-h100.toml", "--timeline", ""],
    ["run", "scenarios/llama3-8b-fsdp-h100.toml", "--trace", ""],
    ["plot", "scenarios/llama3-8b-fsdp-h100.toml", "-o", ""],
    ["numerics", "--ranks", "8", "--plot", ""],
    ["campaign", "scenarios/llama3-8b-fsdp-h100.toml", "--tokens", "1e9", "--plot-run", ""],
], ids=["run-timeline", "run-trace", "plot", "numerics", "campaign"])
def test_an_empty_output_path_is_refused_not_ignored(command):
    """issue 30: --timeline '' was silently ignored."""
    flag = next(a for a in command if a.startswith("-") and command[command.index(a) + 1] == "")
    assert_input_error(clustersim(*command), flag)


@pytest.mark.parametrize("flag, value", [("--cluster-nodes", "4"), ("--placement", "spread")])
def test_shared_fabric_flags_without_shared_fabric_exit_2(flag, value):
    assert_input_error(clustersim("run", "scenarios/llama3-8b-fsdp-h100.toml", flag, value), flag)


def test_collective_algorithm_may_carry_its_protocol():
    """CONTRACT.md: ALGO may carry a protocol, ring:ll; the same as --algo ring --proto ll."""
    base = ["collective", "--op", "all_reduce", "--gpus", "8", "--topology", "dgx-h100", "--sizes", "1M", "--json"]
    joined, split = clustersim(*base, "--algo", "ring:ll"), clustersim(*base, "--algo", "ring", "--proto", "ll")
    assert joined.returncode == 0, joined.stderr
    assert json.loads(joined.stdout) == json.loads(split.stdout)
    assert_input_error(clustersim(*base, "--algo", "ring:ll", "--proto", "simple"), "--proto")


@pytest.mark.parametrize("command", [["numerics", "--ranks", "8", "--json"],
                                     ["routing", "--policy", "token_choice", "--tokens", "64", "--json"]])
def test_seeds_reach_the_documented_64_bits(command):
    """CONTRACT.md: --seed 0 .. 2^64-1 (was refused past 2^53)."""
    assert clustersim(*command, "--seed", str(2**64 - 1)).returncode == 0
    assert_input_error(clustersim(*command, "--seed", str(2**64)), "--seed")
