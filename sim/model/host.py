"""The host (CPU) side of a training step: seconds of host time to issue each GPU op.

A PyTorch rank is one Python thread issuing its GPU work in program order. It does not wait
for the GPU inside a step: kernels are queued on streams, and a collective's ``Work.wait()``
only makes the *current stream* wait for the NCCL stream (pytorch/pytorch
torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, the class comment: "wait() ... the current
stream will block until the NCCL kernel completes"; host blocking only with
NCCL_BLOCKING_WAIT). So the GPU can run at most as fast as the host issues: op i cannot start
before the host has issued ops 0..i (:mod:`sim.engine.core` releases it then). The step's host
starts at t = 0: the previous step ended with a host sync (loss / grad-norm ``.item()``).

What issuing costs (seconds of host time), each constant with its source:

- :data:`CUDA_LAUNCH_S`: one CUDA runtime call that enqueues work (``cudaLaunchKernel``,
  ``cudaEventRecord``, ``cudaGraphLaunch``): 2 us. NVIDIA Technical Blog, "Getting Started
  with CUDA Graphs" (A. Gray, 2019): back-to-back 2.9 us kernels ran at 3.8 us each with the
  launches hidden behind execution (so a launch costs the host less than 3.8 us); 1-3 us per
  ``cudaLaunchKernel`` on CUDA 12 drivers (J. Lin, "From PyTorch op to kernel launch",
  jiahuanglin.xyz, gpu_kernel_serving lesson 18, the dispatch-chain table).
- :data:`EAGER_OP_S`: PyTorch eager dispatch of one operator before its launch: Python
  bytecode ~1 us, pybind11 ~1 us, autograd recording 1-3 us, the ATen dispatcher 1-2 us,
  the backend's choice of algorithm and workspace 1-5 us (the same table: 5-25 us per op in
  all, launch included); 8 us. Megatron-Core's DeepSeek-V3 GB200 write-up (NVIDIA/Megatron-LM
  docs/discussions/deepseek-v3-gb200-optimization) names the same sources -- Python code,
  PyTorch's Python and C++ logic ("a simple ``torch.empty`` ... a few microseconds of
  overhead on the host side"), the CUDA launch -- as the first bottleneck of its baseline.
- :data:`KERNEL_ISSUE_S` = EAGER_OP_S + CUDA_LAUNCH_S per kernel launch the model counts
  (``Kernel.count``).
- :data:`NCCL_CALL_S`: one c10d collective or point-to-point call: the eager op, then
  ProcessGroupNCCL's ``syncStream`` (``cudaEventRecord`` + ``cudaStreamWaitEvent``) and the
  NCCL enqueue with its kernel launch (ProcessGroupNCCL.cpp ``collective()`` /
  ``pointToPoint()``): EAGER_OP_S + 3 CUDA calls.
- :data:`GRAPH_LAUNCH_S`: one captured region replayed (Transformer Engine
  ``make_graphed_callables``, Megatron ``--cuda-graph-impl transformer_engine``): its autograd
  Function call (an eager op) and ``cudaGraphLaunch``, plus the copy of the input into the
  graph's static buffer (one more launch): EAGER_OP_S + 2 CUDA calls. Everything inside the
  region issues with it: the GB200 write-up's CUDA graphs (``--cuda-graph-scope attn
  moe_router moe_preprocess``) took its DeepSeek-V3 step from 610.7 to 663.3 TFLOP/s, and
  router fusion cut that part from 72 kernels to 31 (DeepEP's fused preprocess: 17).
- :data:`SCHEDULE_PASS_S`: Megatron-Core's pipeline schedule (core/pipeline_parallel/
  schedules.py ``forward_step`` / ``backward_step``) per micro-batch and model chunk and
  direction: ``set_input_tensor``, the model call's module hooks, the loss function,
  ``deallocate_output_tensor``, the p2p wrappers and ``torch.autograd.backward``. An
  estimate, not a measurement: ~10 eager operator-equivalents of Python, 10 x EAGER_OP_S.

- :data:`D2H_SYNC_S`: the host reading GPU values (``.tolist()``, ``.cpu()``, an event's
  ``synchronize()``): the eager ops of the device-to-host copies, then the event record and
  the blocking wait. An op built with ``sync`` (:class:`sim.engine.ops.Op`) is such a read:
  the host cannot issue anything after it before the GPU has finished it, so its clock
  jumps to the op's end (:meth:`sim.engine.ops.RankProgram.anchors`) and everything issued
  after it is issued late by its own issue cost, whatever lead the host had built up.
  Megatron-Core's alltoall token dispatcher (megatron/core/transformer/moe/token_dispatcher.py,
  MoEAlltoAllTokenDispatcher ``_maybe_dtoh_and_synchronize``) copies 4 tensors of split
  sizes (tokens_per_expert, input_splits, output_splits, output_splits_tp) on its
  ``cuda_dtoh_stream`` and calls ``d2h_event.synchronize()``: 4 eager copies and 2 CUDA calls.

GPU side: ``sim.model.compute.LAUNCH_S`` (4 us per kernel) stays what it was, the time a kernel
occupies the *GPU* beyond its roofline (launch latency from the queue to the SMs, wave ramp-up
and tail) -- it was fitted with the sustained factors. The host costs here are another
resource's time: when the host runs ahead (GPU-bound) they are hidden entirely, when it falls
behind the GPU waits; no launch is charged twice to one resource.

``torch.compile`` (``training.compile``): Inductor fuses chains of elementwise / memory-bound
operators into one kernel (PyTorch 2 paper, Ansel et al. ASPLOS 2024, section 5: pointwise and
reduction fusion): :func:`fused` makes each run of consecutive memory-bound kernels of one op
(same TP role) one launch. The kernels it fuses are already counted at fused traffic (the
stacks modelled run fused norms, RoPE and gating); what compile saves in HBM traffic is the
plain-PyTorch code's (``training.kernels = "pytorch"``: sim/model/eager.py, which compile turns
back into the fused kernels); within a fused run the bytes stay summed.
"""

from .compute import Kernel

CUDA_LAUNCH_S = 2.0e-6
EAGER_OP_S = 8.0e-6
KERNEL_ISSUE_S = EAGER_OP_S + CUDA_LAUNCH_S
NCCL_CALL_S = EAGER_OP_S + 3 * CUDA_LAUNCH_S
GRAPH_LAUNCH_S = EAGER_OP_S + 2 * CUDA_LAUNCH_S
SCHEDULE_PASS_S = 10 * EAGER_OP_S
D2H_SYNC_S = 4 * KERNEL_ISSUE_S + 2 * CUDA_LAUNCH_S


def launches(kernels) -> int:
    """Kernel launches a list of kernels stands for."""
    return sum(k.count for k in kernels)


def issue_s(kernels) -> float:
    """Host seconds to issue ``kernels`` eagerly, one launch at a time."""
    return launches(kernels) * KERNEL_ISSUE_S


def _memory_bound(k: Kernel) -> bool:
    return not k.flops and not k.attn


def fused(kernels) -> tuple:
    """``kernels`` as torch.compile issues them: each run of consecutive memory-bound kernels
    of the same TP role (a kernel standing for several eager launches, too) becomes one
    kernel (one launch, the run's bytes)."""
    out: list[Kernel] = []
    for k in kernels:
        prev = out[-1] if out else None
        if prev is not None and _memory_bound(k) and _memory_bound(prev) and prev.tp == k.tp:
            out[-1] = prev._replace(bytes=prev.bytes + k.bytes)
        else:
            out.append(k._replace(count=1) if _memory_bound(k) else k)
    return tuple(out)
