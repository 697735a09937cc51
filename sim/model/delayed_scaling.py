"""Transformer Engine's delayed scaling: the amax bookkeeping around every FP8 GEMM.

Under ``training.precision = "fp8"`` with ``training.fp8_recipe = "te"`` (Megatron-Core and
NeMo: ``DelayedScaling``, NeMo's performance scripts' default ``--fp8_recipe ds``) each FP8
GEMM of a Transformer Engine module keeps amax histories -- in the forward for its input,
weight and output (3 per GEMM), in the backward for its output gradient and input gradient
(2 per GEMM): TransformerEngine v1.13 transformer_engine/pytorch/module/base.py
``init_fp8_meta_tensors``: ``num_fp8_tensors = num_gemms * 3 if fwd else num_gemms * 2``
(a grouped linear of E experts is E GEMMs). The cast kernels record each new amax; they
are not reduced or turned into scales inside the module. That happens once per
``fp8_autocast`` region and direction (transformer_engine/pytorch/fp8.py,
``FP8GlobalStateManager.reduce_and_update_fp8_tensors``): ``torch.cat`` of every module's
newest amax into one buffer, an all-reduce (MAX) of it over the autocast's ``fp8_group``
(``torch.distributed.all_reduce(..., async_op=False)``: the current stream waits for it),
then one fused kernel, ``tex.fused_amax_and_scale_update_after_reduction``
(transformer_engine/common/recipe/delayed_scaling.cu), that rolls each amax history by one
and recomputes scale and scale_inv from it. The forward reduction runs at the autocast's
exit (``fp8_autocast_exit``), the backward one in the backward of the region's first FP8
module (module/linear.py ``reduce_and_update_bwd_fp8_tensors``, set by
``is_first_fp8_module``) -- its last FP8 work in the backward.

This module prices those kernels (:func:`amax_kernels`) and the reduction's bytes
(:func:`amax_bytes`); :mod:`sim.parallel.amax` places them per model chunk and micro-batch
with the collective. The amax history length is NeMo's: 1,024 with ``max`` over it
(dgxc-benchmarking grok1/grok1_314b.yaml ``fp8_amax_history_len: 1024``,
``fp8_amax_compute_algo: max``; NeMo's ``bf16_with_fp8_mixed`` recipe sets the same;
Megatron-LM's own default ``--fp8-amax-history-len`` is 1): every rank reads and rewrites
it whole at every update.

Run: ``python -m pytest -q tests/test_amax.py``
"""

from .compute import Kernel, elementwise

AMAX_FWD_PER_GEMM = 3  # input, weight, output (module/base.py init_fp8_meta_tensors)
AMAX_BWD_PER_GEMM = 2  # output gradient, input gradient
AMAX_HISTORY_LEN = 1024  # NeMo / dgxc-benchmarking grok1_314b.yaml fp8_amax_history_len
AMAX_BYTES = 4  # fp32 amaxes, scales and histories (module/base.py: dtype=torch.float32)


def amax_entries(gemms: int, forward: bool) -> int:
    """Amaxes one direction's reduction carries for ``gemms`` FP8 GEMMs."""
    return gemms * (AMAX_FWD_PER_GEMM if forward else AMAX_BWD_PER_GEMM)


def amax_bytes(gemms: int, forward: bool) -> float:
    """Bytes of the all-reduced amax buffer (one fp32 per entry)."""
    return float(AMAX_BYTES * amax_entries(gemms, forward))


def amax_kernels(gemms: int, forward: bool) -> tuple[Kernel, Kernel]:
    """(the ``torch.cat`` of the amaxes, the fused amax-and-scale update) around one reduction:
    the cat reads and writes each fp32 amax; the update reads each history (``AMAX_HISTORY_LEN``
    fp32), writes it rolled, reads the reduced amax and writes scale and scale_inv
    (delayed_scaling.cu ``kernel_bulk``: one pass over each history, in place)."""
    n = amax_entries(gemms, forward)
    cat = elementwise(2 * AMAX_BYTES * n)
    update = elementwise(AMAX_BYTES * n * (2 * AMAX_HISTORY_LEN + 3))
    return cat, update
