"""What an op is, as types: its :class:`Category` (which stream family and parallel axis
it belongs to), its :class:`Phase` (which part of the training step it serves) and the
:class:`StreamName` of the fixed streams it runs on.

Both are set where an op is built (:mod:`sim.parallel.program`'s ``RankBuilder``, the RL
trainer's weight broadcast) and read by every output (:mod:`sim.outputs.metrics`,
:mod:`sim.outputs.timeline`, :mod:`sim.rl.trainer`), so nothing parses op names. They are
``StrEnum`` members: the spans table's ``category`` column, the Chrome trace's ``cat`` and
every JSON/CSV output write their plain string value, unchanged from the strings they replace.
"""

from enum import StrEnum


class Category(StrEnum):
    """What an op does: compute, or a collective on one parallel axis (its stream family).
    The axes are also what a layout is keyed by (:class:`sim.parallel.layout.Layout`'s sizes,
    coordinates and groups) and the planner's groups (:class:`sim.plan.comm.Groups`)."""

    COMPUTE = "compute"
    TP = "tp"  # tensor (and sequence) parallel collectives, expert-TP ones too
    CP = "cp"  # context parallel: ring exchange of K/V
    EP = "ep"  # expert parallel: token all-to-alls
    PP = "pp"  # pipeline sends and receives
    DP = "dp"  # data parallel: gradient reductions, ZeRO / FSDP gathers
    WEIGHTS = "weights"  # RL: trainer -> generator weight transfer
    TAIL = "tail"  # RL exports: a generator's underfull tail of a batch
    IDLE = "idle"  # outputs only: a gap on a compute stream (trace, timeline)
    HOST = "host"  # outputs only: the host issuing a pass's work (sim/outputs/host.py)


COMM_AXES = (Category.DP, Category.TP, Category.PP, Category.EP, Category.CP)  # the parallel axes (summary order)


class StreamName(StrEnum):
    """The streams the builders name (a collective's default stream is its axis's: ``tp`` ...;
    the pipeline's send/recv streams are one per side and direction, and per chunk under the
    two-chunk zero-bubble schedules: :data:`sim.parallel.pp.STREAMS`). The outputs find a
    rank's compute stream by :attr:`COMPUTE`."""

    COMPUTE = "compute"  # kernels; also where a framework waits on the host (a D2H sync)
    DP = "dp"  # gradient reductions, ZeRO's and FSDP's gathers, the loss and norm syncs
    DP_AG = "dp_ag"  # ZeRO's parameter all-gathers of the next step
    DP_RS = "dp_rs"  # FSDP's gradient reduce-scatters
    AMAX = "amax"  # FP8 delayed scaling's amax all-reduce (its own process group: sim/parallel/amax.py)
    PP_SEND_FWD = "pp_send_fwd"  # activations to the next stage
    PP_RECV_FWD = "pp_recv_fwd"  # activations from the previous stage
    PP_SEND_BWD = "pp_send_bwd"  # gradients to the previous stage
    PP_RECV_BWD = "pp_recv_bwd"  # gradients from the next stage
    PP_SEND_FWD1 = "pp_send_fwd1"  # the same four in the second chunk's pipeline (zb-v, DualPipe(V))
    PP_RECV_FWD1 = "pp_recv_fwd1"
    PP_SEND_BWD1 = "pp_send_bwd1"
    PP_RECV_BWD1 = "pp_recv_bwd1"
    WEIGHTS = "weights"  # RL: the trainer's broadcast of its weights to the generators
    TAIL = "tail"  # RL exports: a generator's underfull batches


class Phase(StrEnum):
    """Which part of a training step an op serves (the pass that builds it says so)."""

    FORWARD = "forward"
    BACKWARD = "backward"  # data and weight gradients (one op, or split under TP: tp.split_backward)
    RECOMPUTE = "recompute"  # a forward rerun inside the backward (full or selective recompute)
    OPTIMIZER = "optimizer"  # the optimizer step and ZeRO's gather of the updated parameters
    WEIGHT_SYNC = "weight_sync"  # RL: the trained weights broadcast to the generators
