"""PyTorch profiler (Kineto) traces: GPU kernels by class, GEMM shapes, the step's breakdown.

A trace is the Chrome-trace JSON ``torch.profiler`` writes (``export_chrome_trace`` or
``tensorboard_trace_handler``; ``.json`` or ``.json.gz``): ``schemaVersion``, optional
``distributedInfo`` (rank, world size), and ``traceEvents``: ``cat`` "cpu_op" (aten operators,
with ``Input Dims`` / ``Input type`` under ``record_shapes=True``), "cuda_runtime" / "cuda_driver" launches,
"kernel" / "gpu_memcpy" / "gpu_memset" device events, "user_annotation" ``ProfilerStep#N``.
A kernel carries the ``External id`` of the operator that launched it, which gives a GEMM its
shape. Kernels are classed by name as NCCL's (``ncclDevKernel_AllReduce_RING_LL``: by op),
GEMM (cuBLAS/CUTLASS/nvjet), attention (flash/fmha/cuDNN SDPA), memory copies, and
elementwise (every other kernel).

A kernel whose correlation id is below the first launch the trace recorded was launched before
the trace began -- under ``torch.profiler``'s schedule, a warm-up step's work still queued on the
GPU when the active steps start (a BF16 Llama trace on an H200: 861 kernels and memsets, the first
274 ms) --
and is left out: it belongs to no traced step and has no operator to give it a shape.

The breakdown of a rank's GPU time over its traced steps: compute (the union of non-NCCL
kernels), exposed communication (NCCL kernels not under compute), idle (the rest of the
window from its first kernel to its last), each divided by the ProfilerStep count; and of the
idle, the compute stream's wait for its host (:func:`host_wait`: each kernel's launch call is
kept with it, ``launched``).
"""

from dataclasses import dataclass, replace
import gzip
import json
from pathlib import Path
import re

from .. import bounds
from ..errors import InputError

CLASSES = ("gemm", "attention", "elementwise", "memory", "nccl")
_NCCL_OP = re.compile(r"nccl\w*?_(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|AllToAll)", re.I)
_GEMM = re.compile(r"gemm|xmma|cutlass.*(tensorop|wgmma)|nvjet|cublas|matmul", re.I)
_ATTN = re.compile(r"flash|fmha|attention|sdpa|cudnn.*(fprop|bprop)", re.I)
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")
HALF_TYPES = ("c10::BFloat16", "c10::Half")
# Where a kernel launch is recorded: the runtime's cudaLaunchKernel, or the driver's cuLaunchKernelEx
# (cuBLASLt's nvjet GEMMs and cuDNN's SDPA kernels under torch 2.11 / CUDA 13 are launched this way).
LAUNCHES = ("cuda_runtime", "cuda_driver")
MAX_TRACE_BYTES = bounds.MAX_FILE_BYTES * 1024  # 1 GiB of JSON: one rank's Kineto trace of a few steps is 10-300 MB
DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
               "signed char": 1, "unsigned char": 1, "c10::Float8_e4m3fn": 1}


@dataclass(frozen=True)
class Kernel:
    """One device kernel: class, name, start and duration (s), the op of an NCCL kernel, and
    for a GEMM with a recorded shape its FLOPs and smallest dimension (0 when unknown)."""

    cls: str
    name: str
    start: float
    dur: float
    op: str = ""
    flops: float = 0.0
    min_dim: float = 0.0
    half: bool = False  # BF16/FP16 operands (what the simulator's GEMM curve is for)
    bytes: float = 0.0  # an NCCL kernel's message (its c10d call's tensor bytes; 0 when unknown)
    call: str = ""  # the operator call that launched it, where several kernels share its FLOPs (SDPA)
    stream: int = 0  # the CUDA stream it ran on (the event's tid)
    launched: float | None = None  # when its launch call (cuda_runtime / cuda_driver) began, s; None: not recorded


@dataclass(frozen=True)
class Trace:
    """One rank's trace: its kernels and how many ProfilerSteps it spans."""

    path: str
    rank: int
    world: int | None
    kernels: tuple[Kernel, ...]
    steps: int
    launched_before: int = 0  # kernels left out: launched before the trace began (see parse)


def looks_like(text_head: str) -> bool:
    """Whether a file starts as JSON (a trace candidate)."""
    return text_head.lstrip().startswith("{")


def _unzipped_size(path: Path, chunk: int = 16 << 20) -> int:
    """Bytes a gzip file decompresses to, read in chunks (at most one past the limit)."""
    size = 0
    with gzip.open(path) as f:
        while size <= MAX_TRACE_BYTES and (block := f.read(chunk)):
            size += len(block)
    return size


def read_json(path: Path) -> dict:
    """A trace file's JSON (gzip allowed), InputError naming the file on malformed input."""
    with open(path, "rb") as f:  # (a regular file: calibrate's classify checked it)
        zipped = f.read(2) == b"\x1f\x8b"
    try:  # a gzip is measured streaming first, so a gzip bomb is refused without filling memory
        size = _unzipped_size(path) if zipped else path.stat().st_size
        if size <= MAX_TRACE_BYTES:
            with gzip.open(path) if zipped else open(path, "rb") as f:
                raw = f.read()
    except (OSError, EOFError) as exc:
        raise InputError("INPUT", f"{path}:1: truncated gzip ({exc})") from None
    if size > MAX_TRACE_BYTES:
        raise InputError("INPUT", f"{path}:1: {size:,} bytes{' uncompressed' if zipped else ''}, past the "
                                  f"{MAX_TRACE_BYTES:,} of a trace")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        line = getattr(exc, "lineno", 1)
        raise InputError("INPUT", f"{path}:{line}: malformed JSON ({exc})") from None
    except RecursionError:
        raise InputError("INPUT", f"{path}:1: JSON nested too deeply to be a trace") from None


def parse(path: str | Path) -> Trace:
    """Read one rank's Kineto trace; InputError naming ``file:line`` when it is not one."""
    path = Path(path)
    data = read_json(path)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list) or "schemaVersion" not in data:
        raise InputError("INPUT", f"{path}:1: not a PyTorch profiler (Kineto) trace: no 'schemaVersion' and "
                                  "'traceEvents' (a Chrome trace of another framework?)")
    launchers = _launchers(events)
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
    first = min(launchers, default=None)
    traced = [e for e in device if not _before(e, first)]
    launch_ts = {(e.get("args") or {}).get("correlation"): float(e["ts"]) * 1e-6 for e in events
                 if e.get("ph") == "X" and e.get("cat") in LAUNCHES}
    kernels = [replace(_kernel(e, launchers), stream=_int(e.get("tid")),
                       launched=launch_ts.get((e.get("args") or {}).get("correlation"))) for e in traced]
    if not any(k.cls != "memory" for k in kernels):
        raise InputError("INPUT", f"{path}:1: no GPU kernels (cat 'kernel'): a CPU-only trace, or not PyTorch's")
    steps = len({e.get("name") for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    info = data.get("distributedInfo") or {}
    return Trace(str(path), int(info.get("rank", 0)), info.get("world_size"), tuple(sorted(kernels, key=lambda k: k.start)),
                 max(steps, 1), len(device) - len(traced))


def _before(e: dict, first) -> bool:
    """Whether a device event was launched before the trace's first recorded launch (correlation
    ids grow with each launch)."""
    corr = (e.get("args") or {}).get("correlation")
    return first is not None and isinstance(corr, int) and corr < first


def _launchers(events: list) -> dict:
    """Kernel correlation id -> the CPU operators and annotations open on the launching thread
    when the launch (a "cuda_runtime" or "cuda_driver" event with the same correlation) ran, outermost
    first; the ProfilerStep count is of distinct step names (PyTorch records each step on the CPU
    and again as a "gpu_user_annotation")."""
    by_thread: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", *LAUNCHES):
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out = {}
    for evs in by_thread.values():
        stack: list = []
        for e in sorted(evs, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0)))):
            t = float(e["ts"])
            while stack and float(stack[-1]["ts"]) + float(stack[-1].get("dur", 0)) < t:
                stack.pop()
            if e["cat"] in LAUNCHES:
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    out[corr] = list(stack)
            else:
                stack.append(e)
    return out


def _kernel(e: dict, launchers: dict) -> Kernel:
    name, start, dur = e.get("name", ""), float(e["ts"]) * 1e-6, float(e.get("dur", 0.0)) * 1e-6
    if e.get("cat") != "kernel":
        return Kernel("memory", name, start, dur)
    ancestors = launchers.get((e.get("args") or {}).get("correlation"), [])
    nccl = _NCCL_OP.search(name)
    if nccl or name.lower().startswith("nccl"):
        op, nbytes = _nccl_call(ancestors)
        return Kernel("nccl", name, start, dur, op=op or (_snake(nccl.group(1)) if nccl else "other"), bytes=nbytes)
    if _ATTN.search(name) or _sdpa(ancestors) is not None:  # (cuDNN's backward helpers carry no attention name)
        return _attention(name, start, dur, ancestors)
    if _GEMM.search(name):
        op = next((a for a in reversed(ancestors) if a.get("name") in GEMM_OPS), None)
        flops, min_dim, half = _gemm_shape(op) if op else (0.0, 0.0, False)
        return Kernel("gemm", name, start, dur, flops=flops, min_dim=min_dim, half=half)
    return Kernel("elementwise", name, start, dur)


def _int(x) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return 0


def _nccl_call(ancestors: list) -> tuple[str, float]:
    """(op, bytes) of the c10d call a NCCL kernel serves: the ``nccl:all_reduce`` annotation
    PyTorch's ProcessGroupNCCL records, its Input Dims and type (("", 0) when absent)."""
    for a in reversed(ancestors):
        name = a.get("name", "")
        if name.startswith("nccl:"):
            args = a.get("args") or {}
            dims, types = args.get("Input Dims") or [], args.get("Input type") or []
            elems = sum(_prod(d) for d in dims if isinstance(d, list) and d)
            return name.split(":", 1)[1], float(elems * DTYPE_BYTES.get(types[0] if types else "", 4))
    return "", 0.0


# Where each SDPA operator's is_causal and key tensor stand among its arguments (PyTorch's
# aten/src/ATen/native/native_functions.yaml signatures); an operator not listed: argument 1.
CAUSAL_ARG = {"aten::scaled_dot_product_attention": 5, "aten::_scaled_dot_product_flash_attention": 4,
              "aten::_scaled_dot_product_flash_attention_backward": 11,
              "aten::_scaled_dot_product_cudnn_attention": 6, "aten::_scaled_dot_product_cudnn_attention_backward": 14,
              "aten::_scaled_dot_product_efficient_attention": 6}
KEY_ARG = {"aten::_scaled_dot_product_flash_attention_backward": 2,
           "aten::_scaled_dot_product_cudnn_attention_backward": 2}


def _sdpa(ancestors: list):
    """The innermost SDPA / flash-attention operator a kernel was launched under, or None."""
    return next((a for a in reversed(ancestors) if "scaled_dot_product" in a.get("name", "")
                 or "flash_attention" in a.get("name", "")), None)


def _attention(name: str, start: float, dur: float, ancestors: list) -> Kernel:
    """A flash/cuDNN attention kernel, or any kernel an SDPA operator launched (cuDNN's backward
    runs five: dot(dO, O), the flash bprop, dQ's conversion and a head reduction per K and V
    under GQA); with the operator's shapes, the call's FLOPs (4 B H L S D forward, 2.5x that
    backward, halved when causal) and the keys a query attends, ``call`` naming the operator so
    its kernels' times add up to one launch of those FLOPs."""
    op = _sdpa(ancestors)
    if op is None:
        return Kernel("attention", name, start, dur)
    args, opname = op.get("args") or {}, op.get("name", "")
    dims, concrete = args.get("Input Dims") or [], [str(c) for c in args.get("Concrete Inputs") or []]
    try:
        (b, h, q, d), k = dims[0][:4], dims[KEY_ARG.get(opname, 1)][2]
    except (ValueError, IndexError, TypeError):
        return Kernel("attention", name, start, dur)
    at = CAUSAL_ARG.get(opname)
    causal = (concrete[at] == "True") if at is not None and at < len(concrete) else "True" in concrete[3:6]
    backward = "backward" in opname
    flops = 4.0 * b * h * q * k * d * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
    half = any(t in HALF_TYPES for t in args.get("Input type") or [])
    return Kernel("attention", name, start, dur, flops=flops, min_dim=k / 2 if causal else k, half=half,
                  op="backward" if backward else "forward", call=_call_id(op))


def _call_id(op: dict) -> str:
    """One operator call's identity: its External id, else its thread and start."""
    args = op.get("args") or {}
    ext = args.get("External id")
    return f"ext{ext}" if ext is not None else f"{op.get('tid')}@{op.get('ts')}"


def _snake(op: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", op).lower()  # AllReduce -> all_reduce


def _gemm_shape(op: dict) -> tuple[float, float, bool]:
    """(FLOPs, smallest of m, n, k, half precision) of a GEMM operator from its Input Dims."""
    args = op.get("args", {})
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    name = op.get("name", "")
    try:
        if name in ("aten::mm", "aten::matmul") and len(dims[0]) == 2:
            (m, k), (_, n) = dims[0], dims[1]
        elif name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
        elif name == "aten::linear":
            *lead, k = dims[0]
            n, m = dims[1][0], _prod(lead)
        elif name == "aten::bmm":
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return 2.0 * b * m * n * k, float(min(m, n, k)), any(t in HALF_TYPES for t in types)
        else:
            return 0.0, 0.0, False
    except (ValueError, IndexError, TypeError):
        return 0.0, 0.0, False
    return 2.0 * m * n * k, float(min(m, n, k)), any(t in HALF_TYPES for t in types)


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals) -> float:
    """Total length of merged intervals."""
    return sum(b - a for a, b in intervals)


def breakdown(spans_compute, spans_comm, window: tuple[float, float]) -> dict[str, float]:
    """Seconds of compute, exposed communication (not under compute) and idle in ``window``."""
    compute = union(spans_compute)
    both = union(list(spans_compute) + list(spans_comm))
    busy = length(compute)
    return {"compute_s": busy, "exposed_comm_s": length(both) - busy,
            "idle_s": max(window[1] - window[0] - length(both), 0.0), "step_s": window[1] - window[0]}


def traced_breakdown(t: Trace) -> dict[str, float]:
    """Per step: compute, exposed communication, idle and the step's length, from the trace."""
    comp = [(k.start, k.start + k.dur) for k in t.kernels if k.cls not in ("nccl",)]
    comm = [(k.start, k.start + k.dur) for k in t.kernels if k.cls == "nccl"]
    window = (t.kernels[0].start, max(k.start + k.dur for k in t.kernels))
    return {k: v / t.steps for k, v in breakdown(comp, comm, window).items()} | {"host_wait_s": host_wait(t)}


def host_wait(t: Trace) -> float:
    """Seconds per step the compute stream (the stream with the most non-NCCL kernel time) sat
    idle because its host had not launched the next kernel yet: Holistic Trace Analysis's "host
    wait" (facebookresearch/HolisticTraceAnalysis hta/analyzers/breakdown_analysis.py,
    ``_analyze_idle_time_for_stream``, commit 0c2146a: the idle interval before a kernel whose
    launch call began after the previous kernel on its stream ended). The simulated side is
    :func:`sim.outputs.host.waits` of the compute stream, at the issue costs of sim/model/host.py."""
    busy: dict[int, float] = {}
    for k in t.kernels:
        if k.cls != "nccl":
            busy[k.stream] = busy.get(k.stream, 0.0) + k.dur
    if not busy:
        return 0.0
    stream = max(busy, key=lambda s: (busy[s], -s))
    wait, prev = 0.0, None
    for k in t.kernels:
        if k.stream != stream:
            continue
        if prev is not None and k.launched is not None and k.launched > prev and k.start > prev:
            wait += k.start - prev
        prev = k.start + k.dur if prev is None else max(prev, k.start + k.dur)
    return wait / t.steps


def class_table(t: Trace) -> list[dict]:
    """Per kernel class (NCCL by op): kernels, seconds per step, share of kernel time."""
    groups: dict[str, list[Kernel]] = {}
    for k in t.kernels:
        size = f" {k.bytes / 2**20:.1f} MiB" if k.cls == "nccl" and k.bytes else ""
        groups.setdefault(k.cls if k.cls != "nccl" else f"nccl:{k.op}{size}", []).append(k)
    total = sum(k.dur for k in t.kernels) or 1.0
    return [{"class": name, "kernels": len(ks), "time_s": sum(k.dur for k in ks) / t.steps,
             "share": sum(k.dur for k in ks) / total} for name, ks in sorted(groups.items())]
