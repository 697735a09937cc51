"""``clustersim collective`` end to end, through a subprocess as a user runs it.

Run ``python -m pytest -q tests/test_cli_collective.py``.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.studies.nccl_tests import bus_factor

ROOT = Path(__file__).resolve().parent.parent


def clustersim(*args):
    return subprocess.run([sys.executable, "-m", "sim", "collective", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_table_has_one_row_per_size():
    out = clustersim("--op", "all_gather", "--algo", "ring", "--gpus", "8", "--topology", "dgx-h100",
                     "--sizes", "1M,1G")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[1].split() == ["bytes", "time_us", "algbw_GBps", "busbw_GBps"]
    rows = [[float(x) for x in line.split()] for line in lines[2:]]
    assert [r[0] for r in rows] == [2**20, 2**30]
    for size, time_us, algbw, busbw in rows:
        assert algbw == pytest.approx(size / time_us / 1e3, abs=0.01)
        assert busbw == pytest.approx(algbw * 7 / 8, abs=0.01)


def test_json_is_a_list_with_the_contract_keys():
    out = clustersim("--op", "all_reduce", "--gpus", "16", "--topology", "dgx-a100", "--sizes", "8,64K,1G",
                     "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["bytes"] for r in rows] == [8, 65536, 2**30]
    for r in rows:
        assert set(r) == {"bytes", "time_us", "algbw_GBps", "busbw_GBps"}
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3, rel=1e-4, abs=1e-5)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * bus_factor("all_reduce", 16), rel=1e-4, abs=1e-5)
    assert rows[0]["time_us"] < rows[1]["time_us"] < rows[2]["time_us"]


BASE = {"--op": "all_reduce", "--algo": "ring", "--gpus": "16", "--topology": "dgx-h100", "--sizes": "1M"}


@pytest.mark.parametrize("change,named", [
    ({"--gpus": "1024", "--topology": "dgx-h100-superpod"}, "--gpus"),  # holds 1016
    ({"--op": "all_sum"}, "--op"),
    ({"--algo": "magic"}, "--algo"),
    ({"--op": "all_gather", "--algo": "tree"}, "--algo"),
    ({"--sizes": "1Q"}, "--sizes"),
    ({"--sizes": "0.5"}, "--sizes"),
    ({"--gpus": "1"}, "--gpus"),
    ({"--gpus": "two"}, "--gpus"),
    ({"--topology": "dgx-z900"}, "--topology"),
    ({"--algo": "nvls", "--topology": "dgx-a100", "--gpus": "8"}, "--algo"),  # A100 NVSwitches cannot reduce
    ({"--algo": "nvls"}, "--algo"),  # 16 GPUs on two nodes without SHARP
    ({"--algo": "nvls_tree", "--gpus": "8"}, "--algo"),  # one node
    ({"--algo": "collnet"}, "--algo"),  # dgx-h100's IB switches do not reduce
    ({"--op": "all_gather", "--algo": "pat"}, "--algo"),  # 8 GPUs per node: NCCL refuses PAT
    ({"--op": "all_reduce", "--algo": "pat", "--topology": "dgx-h100-sharp"}, "--algo"),
    ({"--algo": "nvls", "--proto": "ll", "--gpus": "8"}, "--proto"),  # NVLS runs Simple only
    ({"--op": "all_gather", "--algo": "nvls", "--gpus": "64", "--topology": "gb300-nvl72"}, "--algo"),  # > 32 heads
    ({"--proto": "ll256"}, "--proto"),
    ({"--op": "all_to_all", "--algo": "direct", "--explain": ""}, "--explain"),
    ({"--op": "all_to_all", "--algo": "auto", "--gpus": "4096", "--sizes": "1G"}, "--gpus"),  # issue 30: 5.4 GB
])
def test_bad_arguments_exit_2_with_one_line(change, named):
    out = clustersim(*[x for kv in (BASE | change).items() for x in kv if x != ""])
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and named in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_explain_lists_the_tuners_candidates_and_marks_its_pick():
    """8x H100: NCCL picks ring LL up to 1 MB and NVLS from 2 MB (nccl-tests issue 309)."""
    out = clustersim("--op", "all_reduce", "--gpus", "8", "--topology", "dgx-h100", "--sizes", "1M,2M",
                     "--explain", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["algo"] for r in rows] == ["ring:ll", "nvls"]
    for r in rows:
        chosen = [c for c in r["candidates"] if c["chosen"]]
        assert len(chosen) == 1 and chosen[0]["algo"] == r["algo"]
        assert chosen[0]["nccl_time_us"] == min(c["nccl_time_us"] for c in r["candidates"])
        assert {c["algo"] for c in r["candidates"]} >= {"ring", "ring:ll", "ring:ll128", "tree", "nvls"}
    text = clustersim("--op", "all_reduce", "--gpus", "8", "--topology", "dgx-h100", "--sizes", "2M", "--explain")
    (marked,) = [line for line in text.stdout.splitlines() if "<- auto" in line]
    assert marked.split()[0] == "nvls"


def test_explicit_protocol_changes_the_time():
    args = ("--op", "all_gather", "--algo", "ring", "--gpus", "8", "--topology", "dgx-h100", "--sizes", "8,1G",
            "--json")
    times = {p: [r["time_us"] for r in json.loads(clustersim(*args, "--proto", p).stdout)] for p in ("ll", "simple")}
    assert times["ll"][0] < times["simple"][0] and times["ll"][1] > times["simple"][1]
