"""What an RL run measured: per-pool utilization, throughput, the long tail, staleness.

Run ``clustersim rl SCENARIO [--json]``; CONTRACT.md lists the keys.

Every generator engine's time is tiled by segments: *generate* (prefill or decode with
``running`` of its ``slots`` sequences), *idle* (nothing it may start: waiting for the
trainer or the weights) and *weights* (paused to receive or swap in new weights). A
generate segment counts ``running / slots`` of its time as useful and the rest as lost
to the **long tail**: the engine runs underfull because the sequences it could start
must wait for the stragglers of earlier ones (the staleness gate). So per engine
``useful + long tail + idle + weights = wall``, and

- ``generator_utilization`` = useful / wall, over all engines;
- ``generating_utilization`` = useful / (useful + long tail): how full the batches are
  while generating (the synchronous closed form E[sum L] / (n E[max L]) in the
  decode-bound limit, n sequences per engine);
- ``long_tail_s`` = the long tail in whole-pool seconds (engine-seconds / engines).

Staleness: a token generated with weights v and trained on at step n lags n - v steps;
``mean_staleness_steps`` weighs tokens, ``mean_sequence_staleness_steps`` takes each
sequence's oldest token.
"""

import numpy as np

from .loop import Segment, lag_array


def engine_times(generator, wall: float) -> dict:
    """Seconds of one engine: useful, long tail, idle, weights (segments clipped to the wall)."""
    out = dict.fromkeys(("useful", "tail", "idle", "weights"), 0.0)
    for start, end, kind, running, _ in generator.segments:
        end = wall if end is None else min(end, wall)
        dt = max(end - start, 0.0)
        if kind is Segment.GENERATE:
            full = running / generator.cost.slots
            out["useful"] += dt * full
            out["tail"] += dt * (1 - full)
        else:  # idle, weights: named as their segments
            out[kind.value] += dt
    return out


def pool_times(generators, wall: float) -> dict:
    """Engine-seconds of each kind summed over the generator pool."""
    total = dict.fromkeys(("useful", "tail", "idle", "weights"), 0.0)
    for g in generators:
        for k, v in engine_times(g, wall).items():
            total[k] += v
    return total


def staleness(steps) -> dict:
    """Token-weighted and per-sequence lags over every trained token."""
    lags, tokens = lag_array(steps)
    seq = np.concatenate([np.asarray(st.seq_lags, dtype=float) for st in steps])
    return {"mean_staleness_steps": float((lags * tokens).sum() / tokens.sum()),
            "max_staleness_steps": int(lags.max()),
            "mean_sequence_staleness_steps": float(seq.mean()),
            "max_sequence_staleness_steps": int(seq.max())}


def summarize(s, loop, wall: float, facts: dict) -> dict:
    """The summary dict (``facts``: engines, slots, weight bytes, peak FLOP/s, ...)."""
    rl, steps, gens = s.rl, loop.steps, loop.generators
    t = pool_times(gens, wall)
    engines = len(gens)
    generating = t["useful"] + t["tail"]
    train = sum(st.end - st.start for st in steps)
    transfers = [st.transfer[1] - st.transfer[0] for st in steps if st.transfer]
    trained = sum(st.response_tokens for st in steps)
    generated = sum(q.emitted for q in loop.prompts.all)
    flops = sum(loop.trainer.flops(st.tokens) for st in steps)
    out = {
        "name": s.name, "mode": rl.mode, "num_gpus": s.cluster.gpus, "generator_gpus": rl.generator_gpus,
        "trainer_gpus": rl.trainer_gpus, "engines": engines, "slots_per_engine": gens[0].cost.slots,
        "max_staleness": facts["k"], "steps": len(steps), "wall_s": wall, "step_time_s": wall / len(steps),
        "generator_utilization": t["useful"] / (engines * wall),
        "generating_utilization": t["useful"] / generating if generating > 0 else 0.0,
        "trainer_utilization": train / wall,
        "tokens_per_s": trained / wall,
        "generated_tokens_per_s": generated / wall,
        "long_tail_s": t["tail"] / engines,
        "long_tail_fraction": t["tail"] / (engines * wall),
        "generator_idle_fraction": t["idle"] / (engines * wall),
        "generator_weights_fraction": t["weights"] / (engines * wall),
        "train_step_s": train / len(steps),
        "trainer_memory_per_gpu_bytes": max(r.summary["memory_per_gpu_bytes"] for r in loop.trainer.anchors.values()),
        "trainer_fits_in_memory": all(r.summary["fits_in_memory"] for r in loop.trainer.anchors.values()),
        "trainer_mfu": flops / (wall * rl.trainer_gpus * facts["peak_flops"]),
        "weight_bytes": facts["weight_bytes"],
        "weight_transfer_s": float(np.mean(transfers)) if transfers else 0.0,
        "response_length_mean": trained / (len(steps) * s.training.global_batch),
        "response_length_max": max(st.max_length for st in steps),
    }
    out.update(staleness(steps))
    return out


def step_table(steps) -> list[dict]:
    """One row per training step: timing, what it trained on, its staleness."""
    rows = []
    for st in steps:
        lags = np.array(list(st.lag_tokens), dtype=float)
        tokens = np.array(list(st.lag_tokens.values()), dtype=float)
        rows.append({"step": st.step, "start_s": st.start, "train_s": st.end - st.start,
                     "micro_batches": st.micro_batches, "packed_tokens": st.tokens,
                     "response_tokens": st.response_tokens, "max_response": st.max_length,
                     "mean_staleness_steps": float((lags * tokens).sum() / tokens.sum()),
                     "max_staleness_steps": int(lags.max()),
                     "transfer_s": st.transfer[1] - st.transfer[0] if st.transfer else 0.0})
    return rows
