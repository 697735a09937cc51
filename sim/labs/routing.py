"""MoE routing lab: real routers over real scores, and a causality checker.

``clustersim routing --policy token_choice|expert_choice|token_drop --tokens T --experts E
--top-k K [--capacity-factor C] [--seed S] [--scores FILE.npy] [--aux-loss] [--json]``

Routers (the rows of ``scores`` [tokens, experts] are tokens in sequence order):

- ``token_choice``: each token takes its top-k experts (Shazeer et al. 2017). Token n's
  experts depend on token n's scores only: causal, but loads can be badly unbalanced.
- ``expert_choice``: each expert takes its top-C tokens, C = capacity_factor * T * k / E
  (Zhou et al. 2022). Loads are exactly balanced; token n's experts depend on how
  strongly *later* tokens match each expert -- the seeds' Llama 4 failure mode.
- ``token_drop``: token choice, then each expert keeps at most C = ceil(cf * T * k / E)
  tokens; overflow is dropped. ``--drop-order score`` (default) keeps the strongest
  matches, as GShard/Switch's batch-prioritized routing does, so a later, better-matched
  token can push an earlier one out -- the seeds' Gemini 2 Pro failure mode.
  ``--drop-order position`` keeps the earliest tokens (first come, first served), which
  is causal within the sequence.

Causality check: for token n, replace the scores of every token after n with fresh draws
from the same distribution and route again; a violation is any change in token n's
expert set or drop status. ``checked`` tokens are spread evenly over the sequence.

``--aux-loss`` (token choice): learns a per-expert router bias by gradient descent on the
Switch Transformer load-balancing loss E * sum_e f_e P_e (Fedus et al. 2021) over
*earlier* batches, then routes the checked batch with that fixed bias: balance improves
and causality is untouched, because the bias is a parameter, not a function of the batch.
"""

import json
import os
import stat

import numpy as np

from .. import bounds
from ..errors import InputError
from ..input.choices import ExpertRouting
from ..model.routing import DROP_ORDERS, POLICIES, aux_loss, draw, learn_bias, random_scores, route


# --- causality -----------------------------------------------------------------------------

def check_causality(scores: np.ndarray, policy: str, top_k: int, capacity_factor: float, seed: int,
                    skew: float = 0.0, checked: int = 256, drop_order: str = "score",
                    bias: np.ndarray | None = None) -> dict:
    """Perturb every token after n; count tokens whose experts or drop status changed."""
    tokens, experts = scores.shape
    kept, wanted = route(scores, policy, top_k, capacity_factor, drop_order, bias)
    rng = np.random.default_rng([seed, 1])
    probes = np.unique(np.linspace(0, tokens - 2, min(checked, tokens - 1)).astype(int)) if tokens > 1 else []
    violations = 0
    for n in probes:
        other = scores.copy()
        other[n + 1:] = draw(rng, tokens - n - 1, experts, skew)
        kept2, _ = route(other, policy, top_k, capacity_factor, drop_order, bias)
        violations += bool((kept2[n] != kept[n]).any())
    loads = kept.sum(axis=0)
    if policy == ExpertRouting.EXPERT_CHOICE:  # tokens no expert took
        dropped = float((kept.sum(axis=1) == 0).mean())
    else:  # token-expert assignments refused for lack of capacity
        dropped = float(1 - kept.sum() / wanted.sum())
    return {"policy": policy, "tokens": tokens, "experts": experts, "top_k": top_k,
            "capacity_factor": capacity_factor, "drop_order": drop_order if policy == ExpertRouting.TOKEN_DROP else None,
            "checked": len(probes), "causality_violations": int(violations),
            "violation_rate": violations / len(probes) if len(probes) else 0.0,
            "max_load_ratio": float(loads.max() / loads.mean()) if loads.mean() > 0 else 0.0,
            "dropped_fraction": dropped, "aux_loss": aux_loss(scores, kept, bias),
            "loads": [int(x) for x in loads]}


# --- command line ------------------------------------------------------------------------

def add_parser(sub) -> None:
    """Register ``clustersim routing``."""
    p = sub.add_parser("routing", help="MoE routing lab: load balance and causality of a router")
    p.add_argument("--policy", required=True, help="|".join(POLICIES))
    p.add_argument("--tokens", type=int, default=None, help="tokens in the batch (default 4096, or the .npy's)")
    p.add_argument("--experts", type=int, default=None, help="experts (default 64, or the .npy's)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (default 2)")
    p.add_argument("--capacity-factor", type=float, default=1.0,
                   help="expert capacity = cf * tokens * k / experts (default 1.0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skew", type=float, default=0.0, help="Zipf-like expert preference of random scores")
    p.add_argument("--scores", help="router scores from a .npy file of shape [tokens, experts]")
    p.add_argument("--drop-order", default="score", help="token_drop keeps the best 'score' or earliest 'position'")
    p.add_argument("--aux-loss", action="store_true", help="token choice with a load-balancing bias learned "
                                                           "on earlier batches")
    p.add_argument("--check", type=int, default=256, help="tokens whose causality is checked (default 256)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


SCORE_MAX = 1e4  # router logits: a softmax past e^(1e4) is already a hard argmax; float32 holds it


def _scores(args) -> np.ndarray:
    if args.scores:
        _check_file(args.scores)
        try:
            scores = np.load(args.scores, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:  # (EOFError: an empty or truncated file)
            raise InputError("--scores", f"cannot read {args.scores!r} as a .npy array: {exc}") from None
        if scores.dtype.kind not in "iuf":  # a structured, string, complex or bool array is no score
            raise InputError("--scores", f"expected real numbers, got an array of dtype {scores.dtype}")
        if scores.ndim != 2 or scores.shape[0] < 1 or scores.shape[1] < 1:
            raise InputError("--scores", f"expected shape [tokens, experts], got {list(scores.shape)}")
        if not np.isfinite(scores).all():
            raise InputError("--scores", "contains NaN or infinite values")
        if np.abs(scores).max() > SCORE_MAX:  # (float32 overflows; softmax of 1e308 is NaN)
            raise InputError("--scores", f"holds |score| = {np.abs(scores).max():.3g}, past {SCORE_MAX:g}: router "
                                         "logits are O(1-100); rescale the file")
        for flag, given, have in (("--tokens", args.tokens, scores.shape[0]), ("--experts", args.experts,
                                                                               scores.shape[1])):
            if given is not None and given != have:
                raise InputError(flag, f"{given} disagrees with the scores file's shape {list(scores.shape)}")
        return scores.astype(np.float32)
    tokens = 4096 if args.tokens is None else args.tokens
    experts = 64 if args.experts is None else args.experts
    if tokens < 1 or tokens > 1 << 20:
        raise InputError("--tokens", f"expected 1..{1 << 20}, got {tokens}")
    if experts < 1 or experts > 4096:
        raise InputError("--experts", f"expected 1..4096, got {experts}")
    bounds.ROUTER_SCORES.check("--tokens" if tokens >= experts else "--experts", tokens * experts)
    return random_scores(tokens, experts, args.seed, args.skew)


def validate(args) -> None:
    """One clear error per bad flag."""
    if args.policy not in POLICIES:
        raise InputError("--policy", f"unknown policy {args.policy!r}; known: {', '.join(POLICIES)}")
    if args.drop_order not in DROP_ORDERS:
        raise InputError("--drop-order", f"expected one of {', '.join(DROP_ORDERS)}, got {args.drop_order!r}")
    bounds.LAB_CAPACITY.check("--capacity-factor", args.capacity_factor)
    bounds.SKEW.check("--skew", args.skew)
    bounds.SEED.check("--seed", args.seed, whole=True)
    if args.check < 0:
        raise InputError("--check", f"must be >= 0, got {args.check}")
    if args.aux_loss and args.policy != ExpertRouting.TOKEN_CHOICE:
        raise InputError("--aux-loss", f"applies to token_choice, not {args.policy}")


def run(args) -> int:
    """Route, check causality, print."""
    validate(args)
    scores = _scores(args)
    tokens, experts = scores.shape
    _check_work(args, tokens, experts)
    if not 1 <= args.top_k <= experts:
        raise InputError("--top-k", f"expected 1..{experts} (the expert count), got {args.top_k}")
    bias = learn_bias(np.random.default_rng([args.seed, 2]), tokens, experts, args.top_k, args.skew) \
        if args.aux_loss else None
    out = check_causality(scores, args.policy, args.top_k, args.capacity_factor, args.seed, args.skew,
                          args.check, args.drop_order, bias)
    out["seed"] = args.seed
    if args.json:
        print(json.dumps(out))
    else:
        _print(out)
    return 0


def _print(out: dict) -> None:
    loads = out["loads"]
    rows = [("policy", out["policy"] + (f" (drop by {out['drop_order']})" if out["drop_order"] else "")),
            ("tokens x experts, top-k", f"{out['tokens']} x {out['experts']}, k={out['top_k']}"),
            ("capacity factor", out["capacity_factor"]),
            ("causality violations", f"{out['causality_violations']} of {out['checked']} checked tokens "
                                     f"({out['violation_rate']:.1%})"),
            ("max / mean expert load", f"{out['max_load_ratio']:.3f}  (min {min(loads)}, max {max(loads)})"),
            ("dropped", f"{out['dropped_fraction']:.2%}"), ("aux loss (1 = balanced)", f"{out['aux_loss']:.4f}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if out["causality_violations"]:
        print("-> token n's routing depends on later tokens: training sees the future, inference cannot.")


def _check_file(path: str) -> None:
    """A .npy of scores must be a regular file no larger than the scores the lab may route."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError("--scores", f"cannot read {path!r}: {exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError("--scores", f"{path!r} is not a regular file")
    if info.st_size > 8 * bounds.ROUTER_SCORES.hi + 4096:  # float64 scores plus the .npy header
        raise InputError("--scores", f"{path!r} has {info.st_size:,} bytes, more than "
                                     f"{bounds.ROUTER_SCORES.hi:,} scores ({bounds.ROUTER_SCORES.why})")


def _check_work(args, tokens: int, experts: int) -> None:
    """Routing sorts tokens x experts scores once, and once more per checked token."""
    bounds.ROUTING_WORK.check("--check", tokens * experts * (min(args.check, tokens) + 1))
