"""Quantized linear layers: the casts around each GEMM, and who runs them.

FP8 (``training.precision = "fp8"``; Transformer Engine's delayed-scaling recipe,
transformer_engine/pytorch/module/linear.py): every linear layer of the transformer
layers runs its forward, dgrad and wgrad GEMMs in FP8; the attention core (flash
attention), router and output layer stay BF16. Each FP8 linear costs a memory-bound cast
kernel (:func:`fp8_cast`); weights are cast once per step (``is_first_microbatch``
caching) in :func:`sim.model.optimizer.optimizer`; amax is produced by the cast kernels themselves.

MXFP8 and NVFP4 (``"mxfp8"``: torchao's MX linears, pytorch/ao torchao/prototype/mx_formats,
as torchtitan's docs/mxfp8.md runs them; ``"nvfp4"``: Transformer Engine's NVFP4BlockScaling
recipe) quantize the same linears: the block scales run along the reduction dimension, so the
forward GEMM and the wgrad GEMM need the input quantized along different axes -- two quantized
copies with their scales, not a transpose of one (read BF16 once, write 2 x (1 + 1/32) bytes
per element for MXFP8, 2 x (0.5 + 1/16) for NVFP4), and likewise the output gradient for dgrad
and wgrad. No norm emits them fused. The attention core, router and output layer stay BF16, as
under FP8 (torchtitan's MXFP8 converter skips the output projection; the router is not an
nn.Linear it converts). NVFP4's other parts -- random Hadamard transforms on the wgrad inputs,
stochastic rounding of gradients, a few sensitive layers kept in BF16 (arXiv:2509.25149,
section 4) -- are not modelled.

Who quantizes (``training.fp8_recipe``): the above is Transformer Engine's recipe ("te", the
default: Megatron-Core and NeMo, whose performance scripts default to per-tensor delayed
scaling, NVIDIA/NeMo scripts/performance/README.md ``--fp8_recipe``: "Defaults to 'ds'").
torchtitan's runs quantize with torchao ("torchao"): no cast is fused with a norm, the weight
is cast in every forward rather than once per step, and each tensor takes more passes
(:data:`TORCHAO_CAST_BYTES`, cited there). Not modelled: FSDP2's float8 all-gather (torchtitan
``enable_fsdp_float8_all_gather``: weights cast on the shard and gathered in FP8), and the
activations torchao saves in BF16 where TE keeps FP8 copies (memory).

:class:`sim.input.choices.Recipe` names who quantizes, :class:`sim.hardware.gpus.Precision` the
format; the scenario holds them (``training.fp8_recipe``, ``training.precision``), and a
:class:`sim.model.layers.Shard` carries them. :func:`sim.model.layers.linear` puts these casts
beside each linear's GEMM.

Run: ``python -m pytest -q tests/test_fp8.py tests/test_fp8_recipe.py tests/test_mx_precision.py
tests/test_precision_kernels.py`` (docs/precision.md: the sources and what they changed)
"""

from ..input.choices import Precision
from .compute import QUANTIZED, Kernel


# torchao (``training.fp8_recipe = "torchao"``, torchtitan's float8 and mxfp8 converters, run
# under torch.compile): HBM bytes its casts move per element of each of a linear's three
# quantized tensors -- the input x, the weight w and the output gradient g -- every micro-batch.
# - fp8, Float8Linear with dynamic tensor-wise scales (pytorch/ao torchao/float8/
#   float8_scaling_utils.py ``hp_tensor_to_float8_dynamic``: amax = max(|t|) over the whole
#   tensor, scale, saturated cast; float8_linear.py casts x and w in every forward -- no
#   per-step weight cache -- and g in the backward). The whole-tensor amax is a reduction the
#   cast waits for, so Inductor runs two kernels: the amax reads t (2 bytes), the cast reads it
#   again (2) and writes e4m3/e5m2 in both layouts the three GEMMs take (torch._scaled_mm wants
#   its first operand row-major and its second column-major, so x, w and g are each read in
#   two layouts: float8_ops.py's ``.t().contiguous().t()``), fused into the cast (1 + 1): 6.
# - mxfp8, MXLinear (torchao/prototype/mx_formats/mx_linear.py ``mx_mm``): x, w and g are each
#   quantized twice from BF16, along dim 0 (``MXTensor.to_mx``) and dim 1
#   (``_to_mxfp8_dim1_kernel_wrapper``), each pass reading 2 bytes and writing 1 + 1/32 (the
#   block's amax is local to its 32 elements and fuses into the pass). These passes do not
#   stream at HBM_EFFICIENCY: :data:`MX_CAST_SHARE`.
# bench/measured/h100-2026-11-26-fp8-moe.json (``fp8_linear``) times the fp8 recipe written out
# and compiled on one H100: bench/measured_fp8.py compares it with what this model charges.
TORCHAO_CAST_BYTES = {Precision.FP8: 2 + 2 + 2 * QUANTIZED[Precision.FP8], Precision.MXFP8: 2 * (2 + QUANTIZED[Precision.MXFP8])}

# torchao's MX casts reach less of the HBM than a streaming kernel (sim.model.compute.HBM_EFFICIENCY,
# 0.8): pytorch/ao torchao/prototype/mx_formats/README.md, "to_mx cast across dim0 and dim1", on
# B200 (8 TB/s HBM3e): "up to 5.5 TB/s for the dim0 cast (with torch.compile), and up to 3.9 TB/s
# for the dim1 cast (with a triton kernel)" (benchmarks/mx_formats/cast_bench.py, 16384 x 16384).
# The two passes move the same bytes, so together they reach the harmonic mean of the two shares:
# 2 / (8 / 5.5 + 8 / 3.9) = 0.570 of the HBM. Measured on B200; GB200 has the same HBM3e, and
# MI355X (the other MX part) takes the same share, unmeasured.
MX_DIM0_SHARE, MX_DIM1_SHARE = 5.5 / 8.0, 3.9 / 8.0
MX_CAST_SHARE = 2 / (1 / MX_DIM0_SHARE + 1 / MX_DIM1_SHARE)


def torchao_cast(m: float, n: float, k: float, quant: Precision) -> Kernel:
    """torchao's casts around one quantized linear on ``m`` tokens, k -> n features, per
    micro-batch: x (m k) and w (n k) in the forward, g (m n) in the backward, each
    :data:`TORCHAO_CAST_BYTES` per element (MXFP8's at :data:`MX_CAST_SHARE` of the HBM)."""
    per = TORCHAO_CAST_BYTES[quant]
    share = MX_CAST_SHARE if quant is Precision.MXFP8 else 0.0
    return Kernel(bytes=per * (m * k + n * k), bwd=m * n / (m * k + n * k), hbm_share=share)


def fp8_cast(n_in: float, n_out: float, fused: bool, operand: float = 1.0) -> Kernel:
    """The casts around one FP8 GEMM with ``n_in`` input and ``n_out`` output elements.
    Forward: TE's fp8_cast_transpose_fused reads BF16 and writes FP8 plus the transpose
    the wgrad GEMM needs (Hopper FP8 GEMMs take only TN layouts): 4 bytes per input
    element; when the preceding norm already emits FP8 (TE LayerNormLinear) only the
    transpose is left (read 1, write 1). Backward: fp8_cast_transpose_bgrad_fused on the
    output gradient, 4 bytes per output element. ``operand``: bytes per quantized element
    with its scales (MXFP8, NVFP4: the two copies above are written in that size)."""
    both = 2 + 2 * operand
    fwd = (2 if fused else both) * n_in
    return Kernel(bytes=fwd, bwd=both * n_out / fwd)
