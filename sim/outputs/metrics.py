"""Spans -> the summary of CONTRACT.md.

Exposed communication is measured, not assumed: for each rank, the time some collective
is in flight while its compute stream is idle. The pipeline bubble is the time a rank's
compute stream is idle with no communication in flight at all.
"""

import numpy as np
import pandas as pd

from ..arrays import run_bounds
from ..engine.kinds import COMM_AXES as AXES, Category, Phase
from ..model.transformer import model_flops_per_token


def union(intervals: np.ndarray) -> np.ndarray:
    """Merge [start, end] rows into disjoint sorted intervals."""
    if len(intervals) == 0:
        return intervals.reshape(0, 2)
    iv = intervals[np.argsort(intervals[:, 0], kind="stable")]
    ends = np.maximum.accumulate(iv[:, 1])
    new = np.r_[True, iv[1:, 0] > ends[:-1]]
    starts = iv[new, 0]
    stops = np.r_[ends[np.flatnonzero(new)[1:] - 1], ends[-1]]
    return np.column_stack([starts, stops])


def length(iv: np.ndarray) -> float:
    """Total length of disjoint intervals."""
    return float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parts of disjoint sorted intervals ``a`` not covered by disjoint sorted ``b``."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return np.array(out) if out else np.zeros((0, 2))


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Length of the intersection of two disjoint interval sets."""
    return length(a) + length(b) - length(union(np.vstack([a, b])))


def rank_times(spans: pd.DataFrame, step: float) -> pd.DataFrame:
    """Per rank: compute busy time, exposed communication, idle bubble."""
    # (a stable sort of rows already in rank order, as sim.outputs.result.spans_frame leaves
    # them, is the identity: skipped, it copied the whole table at the peak RSS of a run)
    ordered = spans if spans["rank"].is_monotonic_increasing else spans.sort_values("rank", kind="stable")
    ranks = ordered["rank"].to_numpy()
    start, end = ordered["start_s"].to_numpy(), ordered["end_s"].to_numpy()  # (views of the columns)
    is_comp = (ordered["category"] == Category.COMPUTE).to_numpy()
    bounds = run_bounds(ranks)  # rows [b[i], b[i + 1]) are one rank's (the table is in rank order)
    rows = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # each rank's rows, contiguous: one rank's [start, end] at a time
        if hi == lo:
            continue
        iv, comp_rows = np.column_stack([start[lo:hi], end[lo:hi]]), is_comp[lo:hi]
        comp, comm = union(iv[comp_rows]), union(iv[~comp_rows])
        busy, exposed = length(comp), length(comm) - overlap(comp, comm)
        rows.append((int(ranks[lo]), busy, exposed, max(step - busy - exposed, 0.0)))
    return pd.DataFrame(rows, columns=["rank", "compute_s", "exposed_comm_s", "idle_s"])


def critical_rank(per_rank: pd.DataFrame) -> pd.Series:
    """The rank held longest by its own work: compute plus exposed communication (ties: lowest rank)."""
    return per_rank.assign(held=per_rank.compute_s + per_rank.exposed_comm_s).sort_values(
        ["held", "rank"], ascending=[False, True]).iloc[0]


PHASES = (Phase.OPTIMIZER, Phase.RECOMPUTE, Phase.BACKWARD, Phase.FORWARD)  # compute_<phase> keys, in this order


def rank_breakdown(spans: pd.DataFrame, rank: int, step: float) -> dict:
    """Where one rank's step went, in seconds: compute by phase (forward, backward,
    recompute, optimizer), communication exposed (not under compute) per axis, and idle
    time with nothing running (the bubble). Axes' exposed times can overlap one another;
    ``exposed_comm`` is their union."""
    mine = spans[spans["rank"] == rank]
    comp = mine[mine.category == Category.COMPUTE]
    phase = comp["phase"].to_numpy()
    iv = comp[["start_s", "end_s"]].to_numpy()
    busy = union(iv)
    out = {f"compute_{label}": float((iv[:, 1] - iv[:, 0])[phase == label].sum()) for label in PHASES}
    comm = mine[mine.category != Category.COMPUTE]
    for axis in AXES:
        sel = comm[comm.category == axis][["start_s", "end_s"]].to_numpy()
        out[f"exposed_{axis}"] = length(subtract(union(sel), busy))
    exposed = length(subtract(union(comm[["start_s", "end_s"]].to_numpy()), busy))
    out.update(exposed_comm=exposed, compute=length(busy), idle=max(step - length(busy) - exposed, 0.0))
    return out


def rank_mean(ctx):
    """Mean over every rank of a per-simulated-rank Series: each simulated rank counts for
    the ranks it stands for (folded classes differ in size once a perturbation splits them)."""
    folding = getattr(ctx, "folding", None)

    def mean(values: pd.Series) -> float:
        if folding is None:
            return float(values.mean())
        w = folding.weights(values.index.to_numpy())
        return float(values.mean()) if (w == w[0]).all() else float(np.dot(values.to_numpy(), w) / w.sum())

    return mean


def throughput(scenario, dims, step: float, peak_flops: float) -> dict:
    """``tokens_per_s``, ``tflops_per_gpu`` and ``mfu`` of a step of ``step`` seconds: the
    scenario's global batch and model FLOPs (CONTRACT.md's convention) over that time."""
    t, n = scenario.training, scenario.cluster.gpus
    flops = model_flops_per_token(dims, t.seq_len) * t.global_batch * t.seq_len
    tflops = flops / step / n / 1e12 if step > 0 else 0.0
    return {"tokens_per_s": t.global_batch * t.seq_len / step if step > 0 else 0.0,
            "tflops_per_gpu": tflops, "mfu": tflops * 1e12 / peak_flops}


def memory_fields(memory, hbm_bytes: float) -> dict:
    """``memory_per_gpu_bytes`` and ``fits_in_memory`` of a peak-memory breakdown."""
    return {"memory_per_gpu_bytes": float(memory.total), "fits_in_memory": bool(memory.total <= hbm_bytes)}


GROUP_ROWS = 1 << 18  # spans rows summed by one groupby in bytes_sent (whole ranks, at least this many)


def bytes_sent(spans: pd.DataFrame) -> pd.DataFrame:
    """Bytes each rank sent per category (ranks x categories, 0.0 where none): the
    ``groupby(["rank", "category"]).bytes.sum()`` of the table, unstacked. Rows in rank
    order (as spans_frame leaves them) are summed a run of whole ranks at a time: each group
    lies in one run, its rows in the same order, so the sums are the same floats, and the
    groupby's keys and hash tables are a run's rather than the table's (~65 MB of the peak
    RSS of ``python bench/step.py --only 405b-1k``)."""
    ranks = spans["rank"].to_numpy()
    if not spans["rank"].is_monotonic_increasing or len(ranks) <= GROUP_ROWS:
        return spans.groupby(["rank", "category"]).bytes.sum().unstack(fill_value=0.0)
    cuts = run_bounds(ranks)
    runs, lo = [], 0
    for cut in cuts[1:]:
        if cut - lo >= GROUP_ROWS or cut == len(ranks):
            runs.append(spans.iloc[lo:cut].groupby(["rank", "category"]).bytes.sum())
            lo = cut
    return pd.concat(runs).unstack(fill_value=0.0)


def summarize(scenario, ctx, spans: pd.DataFrame, memory, hbm_bytes: float, peak_flops: float,
              folded_end: float | None = None) -> dict:
    """The contract's summary keys (the caller adds sim_events, sim_wall_s, straggler_cost_s).
    ``folded_end``: when ranks that were not simulated finish, if that can be later than
    every simulated one (sampled jitter)."""
    n = scenario.cluster.gpus
    step = max(float(spans.end_s.max()) if len(spans) else 0.0, folded_end or 0.0)
    per_rank = rank_times(spans, step)
    critical = critical_rank(per_rank)
    mean = rank_mean(ctx)
    bubble = float(mean(per_rank.set_index("rank").idle_s) / step) if scenario.parallel.pp > 1 and step > 0 else 0.0
    sent = bytes_sent(spans)
    return {
        "name": scenario.name,
        "num_gpus": n,
        "step_time_s": step,
        **throughput(scenario, ctx.dims, step, peak_flops),
        "bubble_fraction": bubble,
        "exposed_comm_s": float(critical.exposed_comm_s),
        "comm_bytes_per_gpu": {a: float(mean(sent[a])) if a in sent else 0.0 for a in AXES},
        **memory_fields(memory, hbm_bytes),
    }
