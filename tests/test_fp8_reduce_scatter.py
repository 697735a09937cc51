"""FP8 buffers for the userbuffers reduce-scatter (``parallel.tp_overlap_fp8_rs``,
sim/parallel/tp.py ``fp8_reduce_scatter``): closed forms read off the built programs.

- with the flag, each chunk of the pipelined forward reduce-scatter (proj_fprop, fc2_fprop)
  carries tokens x hidden x 1 byte / RS_SPLITS, half of the BF16 chunk; every other TP
  collective (the gathers, the backward reductions) keeps its bytes;
- the shipped rows carry it where NeMo's FP8 userbuffers config sets ``fp8_buf`` (the Llama 3.1
  FP8 rows), not on Grok-1 FP8 (NeMo 24.12's default config: BF16 reduce-scatter);
- without ``tp_comm_overlap`` (NCCL's reduce-scatter) it changes nothing;
- bad values exit 2 naming the key (CLI, through a subprocess).

Run: ``python -m pytest -q tests/test_fp8_reduce_scatter.py``
"""

from sim.input.load import scenario_from_dict
from sim.parallel import layer_program, workload
from sim.parallel.tp_overlap import RS_SPLITS
from sim.studies.validation import load_rows

from conftest import assert_refusals, fp8_flag_refusals

HIDDEN, SEQ, TP = 2048, 4096, 4


def scenario(**parallel):
    return scenario_from_dict({
        "model": {"layers": 2, "hidden": HIDDEN, "heads": 16, "vocab": 32768},
        "training": {"seq_len": SEQ, "global_batch": 2, "precision": "fp8"},
        "cluster": {"topology": "dgx-h100", "gpus": TP},
        "parallel": {"tp": TP, "dp": 1, "sequence_parallel": True, "tp_comm_overlap": True, **parallel}})


def tp_bytes(s) -> dict[str, list[float]]:
    """Bytes of each TP collective of rank 0's program, by op name."""
    ctx = layer_program.context(s, "h100-sxm")
    out: dict[str, list[float]] = {}
    for op in workload.build_rank(ctx, 0).program.ops:
        if op.comm is not None and op.name.startswith(("attn_", "mlp_")):
            out.setdefault(op.name, []).append(op.comm.nbytes)
    return out


def test_forward_reduce_scatter_moves_one_byte_per_element():
    plain, fp8 = tp_bytes(scenario()), tp_bytes(scenario(tp_overlap_fp8_rs=True))
    chunk = SEQ * HIDDEN / RS_SPLITS  # (the shard's tokens: the whole sequence at cp 1, gathered)
    for name in ("attn_rs", "mlp_rs"):
        assert set(plain[name]) == {2 * chunk} and set(fp8[name]) == {1 * chunk}
        assert len(fp8[name]) == len(plain[name])
    assert {k: v for k, v in fp8.items() if not k.endswith("_rs")} == \
        {k: v for k, v in plain.items() if not k.endswith("_rs")}


def test_rows_carry_it_where_nemo_sets_fp8_buf():
    rows = {r.id: r.scenario["parallel"] for r in load_rows()}
    assert rows["dg-l70-fp8-64"]["tp_overlap_fp8_rs"] and rows["dg-l405-fp8-1024"]["tp_overlap_fp8_rs"]
    assert "tp_overlap_fp8_rs" not in rows["dg-grok-fp8-2048"]
    assert [k for k, p in rows.items() if p.get("tp_overlap_fp8_rs")] == ["dg-l70-fp8-64", "dg-l405-fp8-1024"]


def test_inert_without_the_userbuffers_overlap():
    """NCCL's reduce-scatter (no tp_comm_overlap) has no FP8 buffers: the same program's bytes."""
    assert tp_bytes(scenario(tp_comm_overlap=False, tp_overlap_fp8_rs=True)) == \
        tp_bytes(scenario(tp_comm_overlap=False))


CLI_BAD = fp8_flag_refusals("parallel.tp_overlap_fp8_rs")


def test_bad_values_exit_2_naming_the_key(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ntp = 2\ndp = 4\n'
                    'sequence_parallel = true\ntp_comm_overlap = true\n')
    assert_refusals(path, CLI_BAD)
