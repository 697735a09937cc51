"""MoE routers over seeded router scores, and the expert loads they give the simulator.

Routers (the rows of ``scores`` [tokens, experts] are tokens in sequence order):

- ``token_choice``: each token takes its top-k experts (Shazeer et al. 2017): causal, but
  loads can be badly unbalanced.
- ``expert_choice``: each expert takes its top-C tokens, C = capacity_factor * T * k / E
  (Zhou et al. 2022): loads exactly balanced, token n's experts depend on later tokens.
- ``token_drop``: token choice, then each expert keeps at most C = ceil(cf * T * k / E)
  tokens (GShard/Switch); overflow is dropped, the best-scoring (``score``) or earliest
  (``position``) kept.

:func:`expert_loads` is what the workload's expert-parallel layers see; the routing lab
(:mod:`sim.labs.routing`, ``clustersim routing``) checks the routers' causality.
"""

from functools import lru_cache
import math

import numpy as np

from ..errors import InputError
from ..input.choices import ExpertRouting

# the routers this module runs (``uniform``, balanced loads, needs none: sim/parallel/workload.py)
POLICIES = (ExpertRouting.TOKEN_CHOICE, ExpertRouting.EXPERT_CHOICE, ExpertRouting.TOKEN_DROP)
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
    """[T, E] bool: each token's top-k experts (ties to the lower expert index): the
    experts above the row's k-th largest score, then as many of those equal to it as are
    left, lowest index first -- the first k of a stable argsort of ``-scores``, found by
    ``np.partition`` in O(E) per row rather than a sort."""
    experts = scores.shape[1]
    if top_k >= experts:
        return np.ones(scores.shape, dtype=bool)
    if top_k <= 0:
        return np.zeros(scores.shape, dtype=bool)
    kth = np.partition(scores, experts - top_k, axis=1)[:, experts - top_k:experts - top_k + 1].copy()  # k-th largest
    chosen = scores > kth
    tied = scores == kth
    left = top_k - chosen.sum(axis=1, keepdims=True)  # (>= 1: the k-th largest itself is tied)
    chosen |= tied & (np.cumsum(tied, axis=1, dtype=np.int32) <= left)
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
    if policy == ExpertRouting.EXPERT_CHOICE:
        kept = expert_choice(logits, capacity(tokens, experts, top_k, capacity_factor))
        return kept, kept
    wanted = token_choice(logits, top_k)
    if policy == ExpertRouting.TOKEN_CHOICE:
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


# --- loads for the simulator ---------------------------------------------------------------

@lru_cache(maxsize=256)
def _loads(policy: str, tokens: int, experts: int, top_k: int, capacity_factor: float, seed: int,
           skew: float) -> tuple[int, ...]:
    kept = np.zeros(experts, dtype=np.int64)
    rng = np.random.default_rng(seed)
    # token choice routes token by token, so chunks are exact; the others need the batch
    chunk = max(1, (1 << 24) // experts) if policy == ExpertRouting.TOKEN_CHOICE else tokens
    for start in range(0, tokens, chunk):
        scores = draw(rng, min(chunk, tokens - start), experts, skew)
        kept += route(scores, policy, top_k, capacity_factor)[0].sum(axis=0)
    return tuple(int(x) for x in kept)


def expert_loads(policy: str, tokens: int, experts: int, top_k: int, capacity_factor: float,
                 seed: int, skew: float = 0.0) -> np.ndarray:
    """Tokens per expert when ``tokens`` tokens are routed by ``policy`` (seeded): what
    the EP all-to-all and the expert GEMMs of one micro-batch see."""
    if policy not in POLICIES:
        raise InputError("model.moe.routing", f"unknown routing policy '{policy}'; known: {', '.join(POLICIES)}")
    return np.array(_loads(policy, int(tokens), int(experts), int(top_k), float(capacity_factor),
                           int(seed), float(skew)), dtype=float)
