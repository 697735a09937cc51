"""Bounds of every number a user can give, each with the one-line reason it holds.

A bound comes from physics (no cluster has more GPUs, no model is that wide) or from what
the simulator can represent (float time resolution, exact integer counts). The scenario
schema (sim/input/scenario.py), topology files and overrides (sim/hardware/topology.py)
and the command-line flags all check against these, so a value past a bound is an
``InputError`` (exit 2) naming the key, never a hang or an impossible result.
CONTRACT.md lists them; ``python -c "import sim.bounds as b; print(b.table())"`` prints it.

Also here: reading a user's file with limits (regular file, size) and the depth of parsed
data, so a FIFO, ``/dev/zero`` or a million nested brackets are refused before parsing.
"""

import math
import os
from pathlib import Path
import stat
from typing import NamedTuple

from .errors import InputError


class Bound(NamedTuple):
    """Closed interval [lo, hi] of a key's values and why it ends there."""

    lo: float
    hi: float
    why: str

    def check(self, key: str, value, whole: bool = False):
        """``value`` as an int (``whole``) or float if it is a finite number inside the bound,
        else InputError(key, reason). Booleans and strings are not numbers; a whole number
        may be written as a float without a fraction (``1e6``), not as ``1.5``."""
        value = number(key, value, whole, exact_limit=EXACT_INT if self.hi <= EXACT_INT else math.inf)  # (seeds)
        if not self.lo <= value <= self.hi:
            raise InputError(key, f"{value:,} is outside {self.lo:,}..{self.hi:,} ({self.why})")
        return value


def number(key: str, value, whole: bool = False, exact_limit: float | None = None):
    """A finite int or float (``whole``: an int, or a float without a fraction, as an int,
    of at most ``exact_limit``, by default 2^53: a count that becomes a float stays exact)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(key, f"expected {'a whole number' if whole else 'a number'}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(key, f"expected a finite number, got {value}")
    if whole and isinstance(value, float):
        if not value.is_integer():
            raise InputError(key, f"expected a whole number, got {value}")
        value = int(value)
    if whole and abs(value) > (EXACT_INT if exact_limit is None else exact_limit):
        raise InputError(key, f"{value:,} is beyond 2^53, where whole numbers stop being exact in floating point")
    return value


EXACT_INT = 2**53  # every count is multiplied into float64 byte and FLOP totals

# --- the cluster -------------------------------------------------------------------------
GPUS = Bound(1, 2**20, "5x the largest announced GPU clusters (~200k GPUs)")
RANK = Bound(0, GPUS.hi - 1, "a rank or node index inside the largest cluster")
DOMAIN = Bound(1, 1024, "GPUs per server or NVLink domain: NVL576 is the largest announced")
SEGMENT = Bound(1, 1024, "nodes per Slurm segment: at most a domain's GPUs (NVL576 is the largest announced)")
NODES_PER_SU = Bound(1, 4096, "servers per scalable unit (DGX SuperPOD: 32)")
SPINES = Bound(1, 2048, "spine switches of a two-level fat tree: at most a leaf's radix (64-144 ports)")
OVERSUBSCRIPTION = Bound(1 / 64, 64, "leaf downlink / uplink bandwidth; real fabrics stay within 4:1")
PLANES = Bound(1, 16, "switch planes per NIC: multi-plane fabrics split a NIC over 2-8 planes")
LINK_GBPS = Bound(0.1, 1e5, "GB/s per direction: 0.1 is below 1 GbE, 1e5 is 100x NVLink5 (900)")
FAULT_FACTOR = Bound(1e-3, 1.0, "a link below 1/1000 of its rate is down (NCCL times out): use 0")
SLOWDOWN = Bound(1.0, 100.0, "a GPU 100x slower than its peers is failed, not straggling")
JITTER_SIGMA = Bound(0.0, 1.0, "relative std dev per op; measured kernel jitter is a few percent, and "
                               "beyond 1 a mean-one draw is mostly far faster than the GPU's peak")
JITTER_FLOOR = Bound(0.7, 100.0, "an op's multiplier below 0.7 would beat the GPU's peak (the roofline "
                                 "is calibrated at ~0.69 of peak)")
JITTER_SAMPLE = Bound(1, GPUS.hi, "ranks a sampled jitter run simulates: at most every rank of the largest "
                                   "cluster (sim/parallel/jitter.py)")
VARIABILITY_SIGMA = Bound(0.0, 0.1, "relative std dev of GPU speeds within one SKU: Sinha et al. (SC22) measured "
                                     "8% (max 22%) variation, a sigma of ~1.5% (max ~4%); at 0.1 the slowest of "
                                     "16k GPUs is ~1.4x the mean, their worst outliers (1.5x the median)")
FAULTS = Bound(0, 4096, "entries in [[stragglers]] or [[cluster.faults]] (one entry names any number of ranks)")

# --- the model ---------------------------------------------------------------------------
LAYERS = Bound(1, 1024, "8x the deepest published LLM (Megatron 1T: 128 layers)")
MTP_LAYERS = Bound(0, 16, "multi-token prediction depths: DeepSeek-V3 trains with 1")
HIDDEN = Bound(1, 131072, "5x the widest published LLM (Megatron 1T: 25,600)")
HEADS = Bound(1, HIDDEN.hi, "attention heads (and kv heads): at most one per hidden unit")
HEAD_DIM = Bound(1, 512, "FlashAttention kernels go to 256; past 512 the causal attention FLOPs "
                         "the contract's MFU counts (12*L*h*s) would report MFU > 1")
FFN = Bound(1, 4 * HIDDEN.hi, "4x the widest hidden size")
VOCAB = Bound(1, 2**21, "8x the largest published vocabulary (Gemma 3: 262,144)")
EXPERTS = Bound(1, 16384, "8x GShard's 2,048 experts, the most of any MoE trained with expert GEMMs")
CAPACITY = Bound(1.0, 1024.0, "capacity factor of training: below 1 experts drop tokens even under balanced "
                               "routing, doing less than the FLOPs MFU counts; past experts/top_k nothing changes")
LAB_CAPACITY = Bound(1e-3, 1024.0, "capacity factor of the routing lab, which studies dropping itself")
ROUTER_KERNELS = Bound(1, 4096, "kernel launches of one router forward: Megatron-Core's unfused DeepSeek-V3 "
                                 "router launches 72 (NVIDIA/Megatron-LM docs/discussions/deepseek-v3-gb200-"
                                 "optimization); 4,096 is over 50x that")
SKEW = Bound(0.0, 16.0, "Zipf exponent: at 16 the first experts win every token by > 11 standard deviations")

# --- training ----------------------------------------------------------------------------
LORA_RANK = Bound(1, 65536, "MLA's latent ranks: DeepSeek-V3 uses 512 (kv) and 1,536 (q); 128x that")
RL_LENGTH_MEAN = Bound(1, 1e6, "tokens per response on average: 10x the longest reasoning traces (~100k)")
RL_LENGTH_SIGMA = Bound(0, 1e7, "tokens, standard deviation of response lengths (capped by rl.lengths.max)")
RL_GROWTH = Bound(0, 1, "relative growth of response lengths per training step: 1 doubles them every step")
RL_TOKENS = Bound(1, 2**20, "tokens per prompt or response: 1M, 4x the longest served contexts")
RL_STALENESS = Bound(0, 1000, "training steps a generator may run ahead of the trainer")
RL_STEPS = Bound(1, 10_000, "training steps simulated: a whole RL run is a few thousand")
RL_SEQS = Bound(1, 65536, "sequences one inference engine runs at once (vLLM max_num_seqs default 256)")
RL_MEMORY_FRACTION = Bound(1e-3, 1.0, "share of HBM for weights and KV cache (vLLM gpu_memory_utilization)")
SEQ_LEN = Bound(1, 2**24, "16M tokens: 60x the longest published training context (Llama 4: 256k)")
BATCH = Bound(1, 2**24, "sequences per step: 4,000x Llama 3's 4k-sequence batches")
WGRAD_DEFERRAL = Bound(0, 2**24, "micro-batches whose output-layer weight gradients wait for the pipeline flush "
                                   "(0: all of them, Megatron's meaning); a step has at most BATCH")
BUCKET_MB = Bound(2**-10, 2**20, "MiB per gradient bucket: 1 KiB to 1 TiB (PyTorch default 25)")
ZERO = Bound(0, 3, "ZeRO stages: 0 (DDP), 1 optimizer, 2 + gradients, 3 + parameters (FSDP)")
SEED = Bound(0, 2**64 - 1, "numpy seeds with a non-negative integer of at most 64 bits")
START_S = Bound(0.0, 1e9, "seconds into the step a straggler starts; any time past the step's end means never")
NAME_CHARS = 255  # a scenario name becomes a file name (plots/<name>.png): 255 bytes on common filesystems
PATH_CHARS = 4096  # a path (hf_config, a topology file): Linux's PATH_MAX

# --- command-line flags --------------------------------------------------------------------
MESSAGE_BYTES = Bound(1, 2**40, "bytes per collective: 1 TiB is more than any GPU's memory (B300: 288 GB)")
ROUTER_SCORES = Bound(1, 2**24, "tokens x experts routed at once: 64 MB of float32 scores, ~0.5 GB while sorted")
ROUTING_WORK = Bound(0, 2**29, "scores routed in all (the batch once per checked token): ~1.5 min of sorting")

# --- files -------------------------------------------------------------------------------
MAX_FILE_BYTES = 1 << 20  # scenario, topology and HF config files: the bundled ones are under 3 KB
MAX_DEPTH = 16  # nesting of tables and arrays: a scenario's deepest key is 4 levels


def read_text(path: str | Path, key: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; InputError(key, why) for a
    missing path, a directory, a FIFO or device (which could block or never end), an
    oversized or undecodable file."""
    path = Path(path)
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        reason = "no such file" if isinstance(exc, FileNotFoundError) else f"cannot read ({exc})"
        raise InputError(key, f"{reason}: {path}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(key, f"{path} is not a regular file")
    if info.st_size > max_bytes:
        raise InputError(key, f"{path} has {info.st_size:,} bytes, more than the {max_bytes:,} allowed")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(key, f"cannot read {path}: {exc}") from None
    if len(data) > max_bytes:  # grew while we looked
        raise InputError(key, f"{path} has more than the {max_bytes:,} bytes allowed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(key, f"{path} is not UTF-8 text ({exc})") from None


def depth(value) -> int:
    """Nesting depth of dicts and lists (a scalar is 0), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level + 1)
            if deepest > MAX_DEPTH:
                return deepest
            stack.extend((child, level + 1) for child in children)
    return deepest


def check_depth(value, key: str) -> None:
    """InputError(key) when ``value`` nests deeper than :data:`MAX_DEPTH`."""
    if depth(value) > MAX_DEPTH:
        raise InputError(key, f"nested more than {MAX_DEPTH} levels deep")


def table() -> str:
    """The bounds as a Markdown table (CONTRACT.md)."""
    rows = [(name, b) for name, b in globals().items() if isinstance(b, Bound)]
    return "\n".join(["| bound | min | max | why |", "|---|---|---|---|"]
                     + [f"| `{n}` | {b.lo:g} | {b.hi:g} | {b.why} |" for n, b in rows])
