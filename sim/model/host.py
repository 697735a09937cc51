"""The host (CPU) side of a training step: seconds of host time to issue each GPU op.

A PyTorch rank is one Python thread issuing its GPU work in program order. It does not wait
for the GPU inside a step: kernels are queued on streams, and a collective's ``Work.wait()``
only makes the *current stream* wait for the NCCL stream (pytorch/pytorch
torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, the class comment: "wait() ... the current
stream will block until the NCCL kernel completes"; host blocking only with
NCCL_BLOCKING_WAIT). So the GPU can run at most as fast as the host issues: op i cannot start
before the host has issued ops 0..i (:meth:`sim.engine.ops.RankProgram.release` says when). The step's host
starts at t = 0: the previous step ended with a host sync (loss / grad-norm ``.item()``).

What issuing costs (seconds of host time), each constant with its source. The measured ones
are host seconds per call on one H100 SXM machine (PyTorch 2.11, CUDA 13.0, 2026-11-26:
bench/measured/h100-2026-11-26.json and, for the calls that file lacks, the same script's
second run h100-2026-11-26-fp8-step.json, written by bench/gpu_measure.py: ``perf_counter``
over thousands of back-to-back calls with tiny kernels, so the host is the bottleneck);
tests/test_host_measured.py reads each field named here and checks the constant against it.
They are an x86 host's: a GPU whose host is slower takes them times ``GPU.host_issue`` (the Grace of a
GB200 / GB300, 2.75x: :data:`sim.hardware.gpus.GRACE_HOST_ISSUE`, applied where the builder charges an op,
sim/parallel/program.py ``RankBuilder._issue``).

- :data:`KERNEL_ISSUE_S`: one eager operator that launches one memory-bound kernel (dispatch,
  autograd recording, ``cudaLaunchKernel``): ``host.eager_add_inplace.host_s``, 7.97 us (an
  in-place add of a one-element tensor).
- :data:`GEMM_ISSUE_S`: one eager operator that launches a library kernel (a GEMM through
  cuBLAS: its heuristic and workspace choice on the host): ``host.eager_linear_1k.host_s``,
  17.1 us (``F.linear`` at 1024 x 1024, BF16). A kernel with FLOPs or flash attention
  (:func:`issue_cost`) is charged this; attention's own ``scaled_dot_product_attention`` call
  was not measured and is taken to cost the same as a GEMM's.
- :data:`GROUPED_GEMM_ISSUE_S`: one GEMM a grouped GEMM's single library call launches after its
  first (``Kernel.grouped``: Transformer Engine's GroupedLinear loops ``nvte_cublas_gemm`` over the
  experts in C++, TransformerEngine 07afda98 common/gemm/cublaslt_gemm.cu
  ``nvte_multi_stream_cublas_gemm``): the library's host work of a GEMM launch beyond an eager
  operator's (``GEMM_ISSUE_S - KERNEL_ISSUE_S``, both measured) plus the launch (:data:`CUDA_LAUNCH_S`),
  11.15 us. The Python TE and Megatron-Core run per expert around that call is
  :data:`EXPERT_PYTHON_S`, once per expert and direction.
- :data:`EXPERT_PYTHON_S`: the Python one grouped linear runs per expert and direction beyond its
  first (the first pays the call's own :data:`STEP_PYTHON_S`). Transformer Engine's GroupedLinear
  loops over its experts in Python (TransformerEngine release_v2.9
  transformer_engine/pytorch/module/grouped_linear.py ``_GroupedLinear.forward``: each expert's input
  and weight quantizer ``set_usage``, ``module.get_weight_workspace``, the saved inputs' and weights'
  ``update_usage``, ``prepare_for_saving`` of its input, weight and FP8 weight, its ``main_grad``
  closure; ``backward``: its ``main_grad`` call, the weight's ``update_usage`` before the dgrad, and
  ``handle_custom_ddp_from_mcore``, a ``torch.empty`` dummy gradient per expert weight), and autograd
  then runs each expert weight's AccumulateGrad and Megatron-Core's per-parameter backward hook
  (Megatron-LM 23dd639c megatron/core/distributed/distributed_data_parallel.py
  ``_make_backward_post_hook``: ``main_grad.add_`` guard, ``param.grad = None``,
  ``register_grad_ready``), every micro-batch. Not measured alone: taken as :data:`STEP_PYTHON_S`, the
  measured Python a launch costs inside a plain PyTorch step (its module calls, autograd recording,
  AccumulateGrad and hooks), which is what one expert's GEMM already paid when the experts ran one
  after the other (Megatron-Core's SequentialMLP); before, a grouped GEMM's experts paid none of it.
- :data:`SPLIT_QUANTIZE_S`: one quantize kernel Transformer Engine's ``split_quantize`` launches per
  expert after the first (``Kernel.grouped`` on a memory-bound kernel: MXFP8, NVFP4; only delayed
  scaling's quantizers take the one fused ``nvte_multi_cast_transpose``: release_v2.9
  transformer_engine/pytorch/csrc/extensions/cast.cpp ``multi_tensor_quantize_impl``, "Quantize
  kernels individually" otherwise, and ``split_quantize`` builds each split's Python tensor object in
  C++, ``bulk_allocate_mxfp8_tensors``): the launch (:data:`CUDA_LAUNCH_S`) and that object, taken as
  one eager operator's dispatch (:data:`EAGER_OP_S`), 10 us. An estimate.
- :data:`NCCL_CALL_S`: one c10d call into ProcessGroupNCCL (``collective()``: the eager op,
  ``syncStream``'s event record and wait, the NCCL enqueue and its kernel launch), per kind
  (:class:`~sim.collectives.kinds.CollectiveOp`), on a world of one GPU (the c10d + NCCL host path, no data moved):
  all-reduce ``nccl.all_reduce_4KiB.host_s`` 24.2 us (128 MiB: 20.0 us, so not a function of
  the size; a second machine of the same kind measured 28.2 us, in the fp8-step file),
  reduce-scatter ``nccl.reduce_scatter_4KiB.host_s`` 29.0 us, all-to-all
  ``nccl.all_to_all_4KiB.host_s`` 40.4 us, all-gather (fp8-step file)
  ``nccl_more.all_gather_4KiB.host_s`` 25.9 us, broadcast (fp8-step file)
  ``nccl_more.broadcast_4KiB.host_s`` 20.3 us. Point-to-point calls (pipeline send/recv,
  context parallelism's ring shift: ``batch_isend_irecv``, ProcessGroupNCCL ``pointToPoint()``)
  were not measured (a world of one GPU has no peer): :data:`P2P_CALL_S` keeps the estimate,
  the eager op and 3 CUDA calls (:data:`EAGER_OP_S` + 3 :data:`CUDA_LAUNCH_S`), 14 us -- lower
  than every measured collective, so pipeline and ring-attention layouts are likely charged
  too little.
- :data:`GRAPH_LAUNCH_S`: one captured region replayed (Transformer Engine
  ``make_graphed_callables``, Megatron ``--cuda-graph-impl transformer_engine``):
  ``host.cuda_graph_100_adds.host_s_per_replay``, 23.1 us (``torch.cuda.CUDAGraph.replay()``
  of a 100-kernel graph). Transformer Engine's wrapper around it (its autograd Function, the
  copy of the input into the graph's static buffer) was not measured: this is its lower
  bound. Everything inside the region issues with it: the GB200 write-up's CUDA graphs
  (``--cuda-graph-scope attn moe_router moe_preprocess``) took its DeepSeek-V3 step from
  610.7 to 663.3 TFLOP/s, and router fusion cut that part from 72 kernels to 31 (DeepEP's
  fused preprocess: 17).
- :data:`D2H_SYNC_S`: the host reading GPU values (``.tolist()``, ``.cpu()``, an event's
  ``synchronize()``): the eager ops of the device-to-host copies, then the blocking wait. An op
  built with ``sync`` (:class:`sim.engine.ops.Op`) is such a read: the host cannot issue
  anything after it before the GPU has finished it, so its clock jumps to the op's end
  (:meth:`sim.engine.ops.RankProgram.anchors`) and everything issued after it is issued late
  by its own issue cost, whatever lead the host had built up. Megatron-Core's alltoall token
  dispatcher (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher
  ``_maybe_dtoh_and_synchronize``) copies 4 tensors of split sizes (tokens_per_expert,
  input_splits, output_splits, output_splits_tp) on its ``cuda_dtoh_stream`` and calls
  ``d2h_event.synchronize()``. Measured: ``host.sync_round_trip.host_s``, 18.9 us, is an eager
  add then ``.item()`` (one copy and its blocking wait); less the add (``eager_add_inplace``)
  that is 10.9 us for one copy with the wait, and each further copy an eager op
  (:data:`KERNEL_ISSUE_S`): 10.9 + 3 x 7.97 = 34.9 us. (The measured wait includes the tiny
  add's GPU latency, which the engine also charges: a microsecond or two counted twice.)
- :data:`SCHEDULE_PASS_S`: Megatron-Core's pipeline schedule (core/pipeline_parallel/
  schedules.py ``forward_step`` / ``backward_step``) per micro-batch and model chunk and
  direction: ``set_input_tensor``, the model call's module hooks, the loss function,
  ``deallocate_output_tensor``, the p2p wrappers and ``torch.autograd.backward``. Not
  measured (bench/gpu_measure.py has no pipeline schedule): an estimate, ~10 eager
  operator-equivalents of Python, 10 x :data:`EAGER_OP_S`.
- :data:`EAGER_OP_S` (8 us, PyTorch eager dispatch of one operator before its launch) and
  :data:`CUDA_LAUNCH_S` (2 us, one CUDA runtime call) are the estimates the two unmeasured
  costs above are built from: Python bytecode ~1 us, pybind11 ~1 us, autograd recording
  1-3 us, the ATen dispatcher 1-2 us, the backend's choice of algorithm 1-5 us, 1-3 us per
  ``cudaLaunchKernel`` on CUDA 12 drivers (J. Lin, "From PyTorch op to kernel launch",
  jiahuanglin.xyz, gpu_kernel_serving lesson 18, the dispatch-chain table; NVIDIA Technical
  Blog, "Getting Started with CUDA Graphs", A. Gray, 2019). The measured eager add (7.97 us
  with its launch) and empty CuPy kernel (5.3 us with CuPy's Python call:
  ``host.cupy_empty_kernel.host_s``) bound them; neither measures either alone.
  Megatron-Core's DeepSeek-V3 GB200 write-up (NVIDIA/Megatron-LM
  docs/discussions/deepseek-v3-gb200-optimization) names the same sources -- Python code,
  PyTorch's Python and C++ logic, the CUDA launch -- as the first bottleneck of its baseline.

- :data:`STEP_PYTHON_S`: what a launch costs the host *inside a training step* beyond the
  isolated call above: the model code's Python around each op (module calls and hooks, views
  and allocations that launch nothing, autograd recording, the autograd engine's backward).
  Measured on the same H100 machine: the eager 4-layer Llama-3-8B-shaped step of
  bench/gpu_measure.py (``hostbound`` rows of h100-2026-11-26.json, batch 1 x 64 tokens, where
  the step is host-bound) issues its 416 GPU events in 14.56 ms of host time; the model issues
  the same step (examples/calibration/llama3-8b-4layers-h200.toml on an H100, ``training.kernels
  = "pytorch"``) as 383 launches in 3.79 ms from the isolated costs alone. The difference over
  the model's launches, (14.56 - 3.80) ms / 385 = 27.9 us, is charged per kernel launch
  (:func:`issue_cost`) and per c10d call (:func:`collective_issue_s`); at 4,096 and 8,192 tokens
  the same step's host time gives 22.5 and 21.2 us (tests/test_host_step.py checks all five
  rows within 25%). Not to CUDA-graph replays (the captured region skips the per-op Python), the
  host's reads of GPU values (their wait is the GPU's) or the schedule's own pass
  (:data:`SCHEDULE_PASS_S`). The measurement is plain PyTorch; Megatron-Core with Transformer
  Engine adds its own Python per module (its DeepSeek-V3 GB200 write-up, NVIDIA/Megatron-LM
  docs/discussions/deepseek-v3-gb200-optimization section 2: "the CPU kernel launch speed cannot
  keep up with the kernel execution speed on GPU", from Python code, PyTorch's Python and C++
  logic and the launch), so this is the plain-PyTorch figure, not an upper bound.

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


from ..collectives.kinds import CollectiveOp
from .compute import Kernel

# Estimates (not measured; see the module docstring): the unmeasured costs are built from them.
CUDA_LAUNCH_S = 2.0e-6
EAGER_OP_S = 8.0e-6
# Measured, bench/measured/h100-2026-11-26.json (``host``, ``nccl``) and h100-2026-11-26-fp8-step.json
# (``nccl_more``): host seconds per call, rounded to 0.01 us (tests/test_host_measured.py).
KERNEL_ISSUE_S = 7.97e-6  # host.eager_add_inplace.host_s
GEMM_ISSUE_S = 17.12e-6  # host.eager_linear_1k.host_s
GRAPH_LAUNCH_S = 23.15e-6  # host.cuda_graph_100_adds.host_s_per_replay
SYNC_ROUND_TRIP_S = 18.94e-6  # host.sync_round_trip.host_s (an eager add, then .item())
D2H_SYNC_S = SYNC_ROUND_TRIP_S - KERNEL_ISSUE_S + 3 * KERNEL_ISSUE_S  # 4 copies, one wait
P2P_CALL_S = EAGER_OP_S + 3 * CUDA_LAUNCH_S  # not measured (no peer on a world of one GPU)
SCHEDULE_PASS_S = 10 * EAGER_OP_S  # not measured
# One GEMM launched from inside a grouped GEMM's library call (Kernel.grouped; module docstring): the
# library's host work of a measured GEMM launch beyond an eager memory-bound operator's, and its launch
GROUPED_GEMM_ISSUE_S = GEMM_ISSUE_S - KERNEL_ISSUE_S + CUDA_LAUNCH_S
# Measured in a whole step (module docstring): bench/measured/h100-2026-11-26.json hostbound, the
# batch 1 x 64 row's host_issue_s (14.56 ms) less the model's isolated costs of that step (3.80 ms),
# over its 385 launches (tests/test_host_step.py recomputes it; 28.1 us before the embedding's
# weight-gradient kernels, sim/model/vocab.py, added two launches to that step)
STEP_PYTHON_S = 27.9e-6
# Per expert and direction of a grouped linear after its first expert (module docstring): TE release_v2.9
# grouped_linear.py's per-expert Python loops and Megatron-Core's per-parameter backward hook, taken as the
# measured per-launch step Python (not measured alone)
EXPERT_PYTHON_S = STEP_PYTHON_S
# One per-expert quantize kernel of TE's split_quantize after the first (MXFP8, NVFP4; release_v2.9 cast.cpp
# multi_tensor_quantize_impl): its launch and the split's Python tensor object (estimate, module docstring)
SPLIT_QUANTIZE_S = CUDA_LAUNCH_S + EAGER_OP_S


# Transformer Engine userbuffers (``parallel.tp_comm_overlap``; sim/parallel/tp_overlap.py): one Python-level
# GEMM is ONE C++ call that issues every chunk and every userbuffers exchange itself (TransformerEngine v2.9,
# 70f53666, transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp: CommOverlapP2PBase::
# split_overlap_ag loops ``nvte_cublas_gemm`` + ``userbuffers_send`` / ``userbuffers_recv`` over the tp steps,
# CommOverlapBase::split_overlap_rs loops ``nvte_cublas_gemm`` + ``reducescatter2_userbuff_stridedoutput`` over
# num_splits). A chunk after the first is a library GEMM launch, no Python (what Kernel.grouped pays):
UB_GEMM_CHUNK_S = GROUPED_GEMM_ISSUE_S
# One ring-exchange step inside that call: userbuffers_send (use_ce: cudaMemcpyAsync + the
# kuserbuffers_pushsend launch; userbuffers/userbuffers.cu), userbuffers_recv's launch, cudaEventRecord and
# two cudaStreamWaitEvent: 6 CUDA runtime calls, no c10d (estimate, CUDA_LAUNCH_S each)
UB_RING_STEP_S = 6 * CUDA_LAUNCH_S
# One pipelined reduce-scatter chunk: cudaEventRecord, cudaStreamWaitEvent, the reducescatter2 kernel's launch
UB_RS_STEP_S = 3 * CUDA_LAUNCH_S

NCCL_CALL_S = {
    CollectiveOp.ALL_REDUCE: 24.22e-6,  # nccl.all_reduce_4KiB.host_s
    CollectiveOp.REDUCE_SCATTER: 29.00e-6,  # nccl.reduce_scatter_4KiB.host_s
    CollectiveOp.ALL_TO_ALL: 40.41e-6,  # nccl.all_to_all_4KiB.host_s
    CollectiveOp.ALL_GATHER: 25.94e-6,  # fp8-step file: nccl_more.all_gather_4KiB.host_s
    CollectiveOp.BROADCAST: 20.26e-6,  # fp8-step file: nccl_more.broadcast_4KiB.host_s
    CollectiveOp.SEND_RECV: P2P_CALL_S,
    CollectiveOp.RING_SHIFT: P2P_CALL_S,
}


def nccl_call_s(op: CollectiveOp | str) -> float:
    """Host seconds of one c10d call of collective ``op`` (a :class:`~sim.collectives.kinds.CollectiveOp`;
    text is converted)."""
    return NCCL_CALL_S[CollectiveOp(op)]


def issue_cost(k: Kernel) -> float:
    """Host seconds to issue ``k`` (its ``count`` launches) eagerly in a training step: a library
    call (GEMM, flash attention) or a memory-bound kernel's operator, plus the step's Python around
    it (:data:`STEP_PYTHON_S`), per launch; one expert's GEMMs a grouped GEMM's call launches
    (``k.grouped``): :data:`GROUPED_GEMM_ISSUE_S` per launch and the expert's Python once
    (:data:`EXPERT_PYTHON_S`); the per-expert quantize kernels of ``split_quantize`` (grouped,
    memory-bound): :data:`SPLIT_QUANTIZE_S` per launch."""
    if k.grouped:
        return k.count * SPLIT_QUANTIZE_S if _memory_bound(k) else k.count * GROUPED_GEMM_ISSUE_S + EXPERT_PYTHON_S
    return k.count * ((KERNEL_ISSUE_S if _memory_bound(k) else GEMM_ISSUE_S) + STEP_PYTHON_S)


def collective_issue_s(op: CollectiveOp | str) -> float:
    """Host seconds of one c10d call of collective ``op`` in a training step: the call
    (:func:`nccl_call_s`) plus the step's Python around it (:data:`STEP_PYTHON_S`)."""
    return nccl_call_s(op) + STEP_PYTHON_S


def launches(kernels) -> int:
    """Kernel launches a list of kernels stands for."""
    return sum(k.count for k in kernels)


def issue_s(kernels) -> float:
    """Host seconds to issue ``kernels`` eagerly, one launch at a time (:func:`issue_cost`
    inlined: a MoE layer's op issues thousands of expert kernels; the same sum, term by term)."""
    gemm, kernel = GEMM_ISSUE_S + STEP_PYTHON_S, KERNEL_ISSUE_S + STEP_PYTHON_S
    return sum((k.count * SPLIT_QUANTIZE_S if not k.flops else k.count * GROUPED_GEMM_ISSUE_S + EXPERT_PYTHON_S)
               if k.grouped else k.count * (kernel if not k.flops and not k.attn else gemm) for k in kernels)


def _memory_bound(k: Kernel) -> bool:
    return not k.flops and not k.attn


def fused(kernels) -> tuple:
    """``kernels`` as torch.compile issues them: each run of consecutive memory-bound kernels
    of the same TP role (a kernel standing for several eager launches, too) becomes one
    kernel (one launch, the run's bytes); a kernel with its own measured HBM share (torchao's MX
    casts, measured as kernels of their own: :data:`sim.model.quant.MX_CAST_SHARE`) stays apart."""
    out: list[Kernel] = []
    for k in kernels:
        prev = out[-1] if out else None
        if prev is not None and _memory_bound(k) and _memory_bound(prev) and prev.tp == k.tp \
                and prev.hbm_share == k.hbm_share and not (k.grouped or prev.grouped):
            out[-1] = prev._replace(bytes=prev.bytes + k.bytes)
        else:
            out.append(k._replace(count=1) if _memory_bound(k) and not k.grouped else k)
    return tuple(out)


def ub_chunk_issue_s(kernels) -> float:
    """Host seconds of a userbuffers GEMM's chunk after its first (:data:`UB_GEMM_CHUNK_S` per GEMM
    launch): its memory-bound kernels (the FP8 casts the model chunks with it) were issued once,
    with the first chunk, before the C++ call (TE quantizes the local shard into the userbuffer)."""
    return sum(k.count * UB_GEMM_CHUNK_S for k in kernels if not _memory_bound(k))


def ub_bulk_gather_issue_s(tp: int) -> float:
    """Host seconds of ``tex.bulk_overlap_ag_with_external_gemm`` (TE v2.9 comm_gemm_overlap.cpp
    ``CommOverlapBase::bulk_overlap_external_ag``): one pybind call (:data:`EAGER_OP_S` and the step's
    Python), ``userbuffers_send_all`` / ``recv_all`` to the tp - 1 peers (3 CUDA calls each, as in
    :data:`UB_RING_STEP_S`) and 6 event calls."""
    return EAGER_OP_S + STEP_PYTHON_S + (3 * (tp - 1) + 6) * CUDA_LAUNCH_S
