"""From a scenario, its step time and the user's campaign options to a :class:`Campaign`.

Run ``clustersim campaign scenarios/llama3-405b-16k-h100.toml --tokens 15e12``.

Defaults (each a flag of ``clustersim campaign``), all assumptions stated in docs/campaign.md:

- detection 2 min (``--detect-min``): most failures crash a process or raise an Xid error
  the launcher sees within seconds; a hang waits for the NCCL watchdog, 10 min by default
  in PyTorch (``kProcessGroupNCCLDefaultTimeout``, torch/csrc/distributed/c10d/
  ProcessGroupNCCL.hpp); watchdog timeouts are 1.7% of Llama 3's interruptions (Table 5).
- restart 10 min (``--restart-min``): reschedule, launch 16k processes, build NCCL
  communicators, warm up. The Llama 3 paper gives no figure ("we reduced job startup and
  checkpointing time", section 3.3.4); recovery systems report 20 s (TrainMover, Lao et
  al. 2024, standby machines, 1,024 GPUs) and 150 s (FlashRecovery, 2025, 4,800 devices)
  where a plain restart takes minutes; docs/campaign.md shows how ETTR moves with it.
- spares: unbounded (a healthy node is always at hand: Llama 3's 16k-GPU job ran in a
  24k-GPU cluster, section 3.3.1). ``--spares N`` makes a finite pool in which a failed
  node is away ``--repair-hours`` (default 48 h, an assumption) before it is a spare again.
- checkpoints every Young/Daly interval (``--checkpoint-every``), synchronous, over
  2 TB/s (:mod:`sim.campaign.checkpoint`).
"""

from dataclasses import dataclass
import math

from ..errors import InputError
from ..hardware import specs
from ..input.scenario import Scenario
from .checkpoint import (DEFAULT_STORAGE_BW, Checkpoint, checkpoint_cost, checkpoint_size, daly_interval,
                         host_bandwidth, young_interval)
from .failures import PLANNED, FailureTable, Fleet, load_table
from .trials import Campaign

DETECT_S = 2 * 60.0  # seconds from a failure to knowing it (see the module docstring)
RESTART_S = 10 * 60.0  # seconds to relaunch the job, checkpoint load excluded
REPAIR_S = 48 * 3600.0  # seconds a failed node is away when spares are finite (assumption)


@dataclass(frozen=True)
class Options:
    """A user's campaign settings, in SI units (``interval_s`` None: Young/Daly)."""

    tokens: float | None  # tokens to train; None with ``days``
    failures: FailureTable | None = None
    interval_s: float | None = None
    mode: str = "sync"
    storage_bw: float = DEFAULT_STORAGE_BW
    detect_s: float = DETECT_S
    restart_s: float = RESTART_S
    spares: int | None = None
    repair_s: float = REPAIR_S
    days: float | None = None  # ``--days``: train this long (wall time) instead of a token count


@dataclass(frozen=True)
class Facts:
    """What a report needs besides the trials."""

    fleet: Fleet
    gpus_per_node: int
    tokens_per_step: int
    checkpoint: Checkpoint
    mtbf_s: float  # between failures that lose work (hardware, software)
    young_s: float  # compute seconds between checkpoints, sqrt(2 C M)
    daly_s: float


def fleet_of(s: Scenario, opts: Options) -> tuple[Fleet, int]:
    """The job's GPUs and nodes, and GPUs per node; checks ``opts.spares`` against them."""
    per_node = s.cluster.gpus_per_node or specs.load_spec(s.cluster.topology).gpus_per_node
    fleet = Fleet(s.cluster.gpus, -(-s.cluster.gpus // per_node))
    if opts.spares is not None and not 0 <= opts.spares <= fleet.nodes:
        raise InputError("--spares", f"expected 0 to {fleet.nodes:,} (the job's nodes), got {opts.spares:,}")
    return fleet, per_node


def build(s: Scenario, step_s: float, opts: Options) -> tuple[Campaign, Facts]:
    """The campaign of ``s`` at ``step_s`` seconds per step under ``opts``."""
    fleet, per_node = fleet_of(s, opts)
    table = opts.failures or load_table()
    rates = table.rates(fleet)
    ckpt = checkpoint_size(s)
    cost = checkpoint_cost(ckpt, opts.storage_bw, opts.mode, host_bandwidth(s))
    losing = float(rates[table.kinds != PLANNED].sum())
    mtbf = math.inf if losing == 0 else 1.0 / losing
    young = young_interval(cost.stall_s, mtbf)
    interval = interval_steps(opts.interval_s if opts.interval_s is not None else young, step_s, cost,
                              auto=opts.interval_s is None)
    tokens_per_step = s.training.global_batch * s.training.seq_len
    deadline = None if opts.days is None else opts.days * 86400.0
    if deadline is None:
        steps = max(1, math.ceil(opts.tokens / tokens_per_step))
    else:  # one step more than fits without failures: every trial is still training at the deadline
        steps = math.floor(deadline / step_s) + 2
    campaign = Campaign(step_s, steps, min(interval, steps), cost, rates, table.kinds, opts.detect_s, opts.restart_s,
                        opts.spares, opts.repair_s, deadline)
    return campaign, Facts(fleet, per_node, tokens_per_step, ckpt, mtbf, young, daly_interval(cost.stall_s, mtbf))


def interval_steps(interval_s: float, step_s: float, cost, auto: bool) -> int:
    """Whole steps between checkpoints (at least one); the automatic choice also waits for
    an asynchronous write to end, since a shorter interval would only stall on it."""
    if math.isinf(interval_s):
        return 2**62
    k = max(1, round(interval_s / step_s))
    return max(k, math.ceil(cost.write_s / step_s)) if auto else k
