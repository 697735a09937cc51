"""Reduction numerics lab: exact swamping facts, error scaling, CLI contract."""

import json

import numpy as np
import pytest

from conftest import assert_input_error, clustersim
from sim.labs.numerics import Accumulator, add, gradients, reduce, ring_sum, to_bf16, tree_sum


def test_fp16_swamping_example_from_the_seeds_is_exact():
    assert add(2048.0, 1.0, "fp16") == 2048.0  # spacing of fp16 in [2048, 4096) is 2: tie to even
    assert add(1024.0, 0.5, "fp16") == 1024.0  # spacing in [1024, 2048) is 1
    assert add(1024.0, 1.0, "fp16") == 1025.0  # ... while a whole 1 still counts
    assert add(2048.0, 3.0, "fp16") == 2052.0  # 2051 is a tie between 2050 and 2052: even mantissa
    assert add(256.0, 1.0, "bf16") == 256.0  # bf16 has 8 significant bits: spacing 2 at 256
    assert add(2048.0, 1.0, "fp32") == 2049.0


def test_bf16_rounding_matches_the_bit_layout():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7, -3.0e-3, 65504.0, 1e38], dtype=np.float32)
    got = to_bf16(x)
    # 1 + 2^-8 is the tie between 1 and 1 + 2^-7: to even (1); 1 + 3*2^-8 ties to 1 + 2^-6
    assert got[0] == 1.0 and got[1] == 1.0 and got[2] == 1 + 2**-6 and got[3] == 1 + 2**-7
    for v in got:  # every result keeps only the top 16 bits
        assert np.float32(v).view(np.uint32) & 0xFFFF == 0
    assert abs(got[4] / x[4] - 1) < 2**-8


def test_a_sum_of_ones_stalls_at_2048_in_fp16():
    acc = Accumulator(np.ones(1), "fp16")
    for _ in range(4999):
        acc.add(np.ones(1))
    assert acc.sum[0] == 2048.0  # 5000 ones sum to 2048: bias, not noise
    assert acc.lost[0] == 5000 - 2048


def test_ring_and_tree_orders_sum_every_rank_once():
    g = np.arange(1, 6 * 12 + 1, dtype=float).reshape(6, 12)  # small integers: exact in fp32
    for fn in (ring_sum, tree_sum):
        got, _ = fn(g, "fp32")
        assert np.array_equal(got, g.sum(axis=0))


def test_fp16_ring_over_1024_ranks_is_more_than_10x_worse_than_fp32():
    fp16, fp32 = reduce(1024, "fp16", "ring"), reduce(1024, "fp32", "ring")
    assert fp16["relative_error"] > 10 * fp32["relative_error"]
    assert fp16["relative_error"] > 1e3 * fp32["relative_error"]  # in fact by thousands


def test_fp16_ring_error_is_a_bias_that_grows_with_the_rank_count():
    rows = [reduce(n, "fp16", "ring", seed=0, elements=4096) for n in (16, 64, 256, 1024)]
    rel = [r["relative_error"] for r in rows]
    assert all(b > 2 * a for a, b in zip(rel, rel[1:]))  # compounds
    for r in rows[1:]:  # nearly all of the error loses magnitude: bias, not noise
        assert r["bias"] < 0 and -r["bias"] > 0.8 * r["relative_error"]
    # noise would average out over elements: here the mean signed error is the error
    fp32 = reduce(1024, "fp32", "ring", elements=4096)
    assert abs(fp32["bias"]) < 0.3 * fp32["relative_error"]


def test_different_seeds_same_conclusion_and_same_seed_same_numbers():
    a, b, c = reduce(512, "fp16", "ring", seed=1), reduce(512, "fp16", "ring", seed=1), reduce(512, "fp16", "ring",
                                                                                               seed=2)
    assert a == b and a != c
    assert -c["bias"] > 0.8 * c["relative_error"]


def test_tree_order_and_fixes_beat_the_fp16_ring():
    ring = reduce(1024, "fp16", "ring")
    assert reduce(1024, "fp16", "tree")["relative_error"] < ring["relative_error"] / 10
    assert reduce(1024, "fp16", "ring", kahan=True)["relative_error"] < ring["relative_error"] / 10
    fp32acc = reduce(1024, "fp16", "ring", accumulate="fp32")
    assert fp32acc["relative_error"] < ring["relative_error"] / 10
    # what is left is the final cast to fp16: within an fp16 rounding (2^-11) per element
    assert fp32acc["relative_error"] < 2**-11


def test_gradients_are_stored_in_the_dtype():
    g = gradients(4, 1000, 0, "fp16")
    assert np.array_equal(g, g.astype(np.float16).astype(np.float64))
    assert np.array_equal(to_bf16(gradients(4, 1000, 0, "bf16")), gradients(4, 1000, 0, "bf16").astype(np.float32))


def test_cli_json_has_the_contract_keys(tmp_path):
    p = clustersim("numerics", "--ranks", "256", "--dtype", "bf16", "--algo", "tree", "--seed", "3", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {"ranks", "dtype", "algo", "relative_error", "bias", "swamped_fraction"} <= set(out)
    assert (out["ranks"], out["dtype"], out["algo"]) == (256, "bf16", "tree")
    assert out == reduce(256, "bf16", "tree", seed=3)


def test_cli_plot(tmp_path):
    png = tmp_path / "n.png"
    p = clustersim("numerics", "--ranks", "64", "--elements", "1024", "--plot", str(png))
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, key", [(["--dtype", "fp8"], "--dtype"), (["--algo", "butterfly"], "--algo"),
                                       (["--ranks", "0"], "--ranks"), (["--accumulate", "int8"], "--accumulate"),
                                       (["--algo", "tree", "--kahan"], "--kahan"), (["--plot", "x.jpg"], "--plot"),
                                       (["--ranks", "65536", "--elements", "4096"], "--elements")])  # issue 30: 5.4 GB
def test_cli_bad_input_exits_2_with_one_line(args, key):
    p = clustersim("numerics", *args)
    assert_input_error(p, key)
