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

from functools import lru_cache
import json
import math

import numpy as np

from ..errors import InputError

POLICIES = ("token_choice", "expert_choice", "token_drop")
DROP_ORDERS = ("score", "position")


# --- scores ------------------------------------------------------------------------------

def preference(experts: int, skew: float) -> np.ndarray:
    """Log prior of each expert: Zipf-like, log p_e = -skew * log(e + 1) (0: balanced)."""
    return (-skew * np.log1p(np.arange(experts))).astype(np.float32)


def random_scores(tokens: int, experts: int, seed: int, skew: float = 0.0) -> np.ndarray:
    """Seeded router logits [tokens, experts]: standard normal plus the skewed prior."""
    rng = np.random.default_rng(seed)
    return draw(rng, tokens, experts, skew)


def draw(rng: np.random.Generator, tokens: int, experts: int, skew: float) -> np.ndarray:
    """``tokens`` rows of logits from the router's distribution."""
    return rng.standard_normal((tokens, experts), dtype=np.float32) + preference(experts, skew)


# --- routers -----------------------------------------------------------------------------

def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Tokens one expert may take: ceil(cf * T * k / E) (GShard), at most T."""
    return min(tokens, math.ceil(capacity_factor * tokens * top_k / experts - 1e-9))


def token_choice(scores: np.ndarray, top_k: int) -> np.ndarray:
    """[T, E] bool: each token's top-k experts (ties to the lower expert index)."""
    top = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
    chosen = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(chosen, top, True, axis=1)
    return chosen


def expert_choice(scores: np.ndarray, cap: int) -> np.ndarray:
    """[T, E] bool: each expert's top-``cap`` tokens by score (ties to the earlier token)."""
    top = np.argsort(-scores, axis=0, kind="stable")[:cap, :]
    chosen = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(chosen, top, True, axis=0)
    return chosen


def drop_overflow(scores: np.ndarray, wanted: np.ndarray, cap: int, order: str = "score") -> np.ndarray:
    """Keep at most ``cap`` of the tokens that want each expert: the best-scoring ones
    (``order="score"``) or the earliest ones (``order="position"``)."""
    key = np.where(wanted, -scores if order == "score" else np.arange(len(scores), dtype=np.float32)[:, None],
                   np.inf)
    rank = np.argsort(np.argsort(key, axis=0, kind="stable"), axis=0, kind="stable")
    return wanted & (rank < cap)


def route(scores: np.ndarray, policy: str, top_k: int, capacity_factor: float,
          drop_order: str = "score", bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(kept [T, E] bool, wanted [T, E] bool): the assignment made, and what each token
    asked for (equal except under token dropping; expert choice has no asking)."""
    tokens, experts = scores.shape
    logits = scores if bias is None else scores + bias
    if policy == "expert_choice":
        kept = expert_choice(logits, capacity(tokens, experts, top_k, capacity_factor))
        return kept, kept
    wanted = token_choice(logits, top_k)
    if policy == "token_choice":
        return wanted, wanted
    return drop_overflow(logits, wanted, capacity(tokens, experts, top_k, capacity_factor), drop_order), wanted


# --- load balancing loss -----------------------------------------------------------------

def softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax in float64."""
    z = np.exp(x - x.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def aux_loss(scores: np.ndarray, chosen: np.ndarray, bias: np.ndarray | None = None) -> float:
    """Switch Transformer load-balancing loss E * sum_e f_e P_e (1 when balanced):
    f_e the share of assignments to expert e, P_e the mean router probability."""
    p = softmax(scores.astype(np.float64) + (0 if bias is None else bias))
    f = chosen.sum(axis=0) / max(chosen.sum(), 1)
    return float(scores.shape[1] * (f * p.mean(axis=0)).sum())


def learn_bias(rng: np.random.Generator, tokens: int, experts: int, top_k: int, skew: float,
               steps: int = 300, lr: float = 0.1) -> np.ndarray:
    """Router bias minimizing the aux loss on a stream of earlier batches: normalized
    gradient descent on E * sum_e f_e P_e, f_e held fixed as in Switch (not differentiable),
    with a step size decaying from ``lr`` to lr/20."""
    bias = np.zeros(experts)
    for i in range(steps):
        s = draw(rng, tokens, experts, skew).astype(np.float64) + bias
        p = softmax(s)
        f = token_choice(s, top_k).sum(axis=0) / (tokens * top_k)
        # dP_e/db_j = mean_t p_te (delta_ej - p_tj)
        grad = experts * (f * p.mean(axis=0) - ((p * f).sum(axis=1, keepdims=True) * p).mean(axis=0))
        scale = np.abs(grad).max()
        if scale > 0:
            bias -= lr * (1 - 0.95 * i / steps) * grad / scale
    return bias - bias.mean()


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
    if policy == "expert_choice":  # tokens no expert took
        dropped = float((kept.sum(axis=1) == 0).mean())
    else:  # token-expert assignments refused for lack of capacity
        dropped = float(1 - kept.sum() / wanted.sum())
    return {"policy": policy, "tokens": tokens, "experts": experts, "top_k": top_k,
            "capacity_factor": capacity_factor, "drop_order": drop_order if policy == "token_drop" else None,
            "checked": len(probes), "causality_violations": int(violations),
            "violation_rate": violations / len(probes) if len(probes) else 0.0,
            "max_load_ratio": float(loads.max() / loads.mean()) if loads.mean() > 0 else 0.0,
            "dropped_fraction": dropped, "aux_loss": aux_loss(scores, kept, bias),
            "loads": [int(x) for x in loads]}


# --- loads for the simulator ---------------------------------------------------------------

@lru_cache(maxsize=256)
def _loads(policy: str, tokens: int, experts: int, top_k: int, capacity_factor: float, seed: int,
           skew: float) -> tuple[int, ...]:
    kept = np.zeros(experts, dtype=np.int64)
    rng = np.random.default_rng(seed)
    # token choice routes token by token, so chunks are exact; the others need the batch
    chunk = max(1, (1 << 24) // experts) if policy == "token_choice" else tokens
    for start in range(0, tokens, chunk):
        scores = draw(rng, min(chunk, tokens - start), experts, skew)
        kept += route(scores, policy, top_k, capacity_factor)[0].sum(axis=0)
    return tuple(int(x) for x in kept)


def expert_loads(policy: str, tokens: int, experts: int, top_k: int, capacity_factor: float,
                 seed: int, skew: float = 0.0) -> np.ndarray:
    """Tokens per expert when ``tokens`` tokens are routed by ``policy`` (seeded): what
    the EP all-to-all and the expert GEMMs of one micro-batch see."""
    if policy not in POLICIES:
        raise InputError("model.moe.routing", f"unknown routing policy {policy!r}; known: {', '.join(POLICIES)}")
    return np.array(_loads(policy, int(tokens), int(experts), int(top_k), float(capacity_factor),
                           int(seed), float(skew)), dtype=float)


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


def _scores(args) -> np.ndarray:
    if args.scores:
        try:
            scores = np.load(args.scores, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError("--scores", f"cannot read {args.scores!r} as a .npy array: {exc}") from None
        if scores.ndim != 2 or scores.shape[0] < 1 or scores.shape[1] < 1:
            raise InputError("--scores", f"expected shape [tokens, experts], got {list(scores.shape)}")
        if not np.isfinite(scores).all():
            raise InputError("--scores", "contains NaN or infinite values")
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
    return random_scores(tokens, experts, args.seed, args.skew)


def validate(args) -> None:
    """One clear error per bad flag."""
    if args.policy not in POLICIES:
        raise InputError("--policy", f"unknown policy {args.policy!r}; known: {', '.join(POLICIES)}")
    if args.drop_order not in DROP_ORDERS:
        raise InputError("--drop-order", f"expected one of {', '.join(DROP_ORDERS)}, got {args.drop_order!r}")
    if not (args.capacity_factor > 0 and math.isfinite(args.capacity_factor)):
        raise InputError("--capacity-factor", f"must be a positive number, got {args.capacity_factor}")
    if not (args.skew >= 0 and math.isfinite(args.skew)):
        raise InputError("--skew", f"must be >= 0, got {args.skew}")
    if args.check < 0:
        raise InputError("--check", f"must be >= 0, got {args.check}")
    if args.aux_loss and args.policy != "token_choice":
        raise InputError("--aux-loss", f"applies to token_choice, not {args.policy}")


def run(args) -> int:
    """Route, check causality, print."""
    validate(args)
    scores = _scores(args)
    tokens, experts = scores.shape
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
