"""The optimizer step's kernels on one rank, once per training step: the gradient buffer
zeroed, gradient-norm clipping's local norm, and Adam (with the gradient cast to fp32 and the
master copy back to the model's weights; under FP8 Transformer Engine's weight casts).
All memory-bound: HBM bytes per parameter the rank updates, cited term by term.

Run: ``python -m pytest -q tests/test_fp8.py tests/test_step_costs.py``
"""

from .compute import Kernel, elementwise


# Bytes per parameter of the optimizer step, term by term (fp32 master weights, Adam's two fp32
# moments, fp32 main gradients; Megatron-Core's distributed optimizer and Float16Optimizer
# with Transformer Engine's FusedAdam / apex multi_tensor_adam):
ADAM_BYTES = 4 * 4 + 3 * 4  # read master weight, main grad, exp_avg, exp_avg_sq; write the three states
MAIN_GRAD_BYTES = 4  # fp32 main gradient (megatron/core/optimizer/distrib_optimizer.py
#                      _copy_model_grads_to_main_grads: shard_main_param.grad = shard_model_grad.float())
MASTER_COPY_BYTES = 4 + 2  # _copy_main_params_to_model_params: read fp32 master, write the bf16 weight


def optimizer_bytes_per_param(grad_bytes: int, copies_to_model: bool = True) -> int:
    """HBM bytes one Adam step moves per parameter it updates: the cast of the reduced
    ``grad_bytes``-wide gradient to an fp32 main gradient (none when the gradient is fp32
    already: ``.float()`` returns it), the Adam kernel (:data:`ADAM_BYTES`), and, when
    ``copies_to_model``, the copy of the fp32 master into the bf16 weight the model computes
    with (:data:`MASTER_COPY_BYTES`; PyTorch FSDP2 keeps fp32 sharded parameters and casts in
    its all-gather instead: no copy). bf16 gradients, Megatron: 6 + 28 + 6 = 40 bytes."""
    cast = grad_bytes + MAIN_GRAD_BYTES if grad_bytes != MAIN_GRAD_BYTES else 0
    return cast + ADAM_BYTES + (MASTER_COPY_BYTES if copies_to_model else 0)


def optimizer(params: float, fp8_weights: float = 0.0, grad_bytes: int = 2, copies_to_model: bool = True) -> list[Kernel]:
    """Adam on ``params`` local parameters, memory-bound: :func:`optimizer_bytes_per_param`
    bytes each, in one launch per kernel (the grad cast, multi-tensor Adam, the master copy).
    Under FP8, Transformer Engine casts each of the ``fp8_weights`` weights the rank computes
    with to FP8 and its transpose once per step (read 2, write 1 + 1 bytes; later
    micro-batches reuse the copies), and updates the amax history and scales in one fused
    kernel."""
    per = optimizer_bytes_per_param(grad_bytes, copies_to_model)
    launches = 1 + (grad_bytes != MAIN_GRAD_BYTES) + copies_to_model
    kernels = [elementwise(per * params, count=launches)]
    if fp8_weights:
        kernels.append(elementwise(4 * fp8_weights, count=2))
    return kernels


def grad_norm(params: float) -> list[Kernel]:
    """The local part of gradient-norm clipping: one multi-tensor L2-norm kernel reading the
    fp32 main gradients of the ``params`` parameters the rank updates (megatron/core/optimizer/
    clip_grads.py ``get_grad_norm_fp32``: ``multi_tensor_l2norm``). The scaling by the clip
    coefficient runs only on steps whose norm exceeds the limit (``clip_coeff < 1``), not
    in the steady state modelled here."""
    return [elementwise(MAIN_GRAD_BYTES * params)]


def zero_grad(params: float, grad_bytes: int) -> list[Kernel]:
    """Megatron-Core zeroes its whole gradient buffer at the start of every step
    (megatron/training/training.py ``train_step``: ``model_chunk.zero_grad_buffer()`` ->
    ``grad_data.zero_()``): a memset writing ``grad_bytes`` per local parameter."""
    return [elementwise(grad_bytes * params)]
