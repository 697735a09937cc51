"""Response lengths of the RL loop: lognormal per prompt, mean and spread growing over training.

Run ``clustersim rl scenarios/rl-llama3-8b-h100.toml`` (section ``[rl.lengths]``).

The seeds: "RL responses grow in mean and variance of length". At training step s the
mean is ``mean * (1 + growth)^s`` and the standard deviation ``sigma * (1 + growth)^s``
(the coefficient of variation stays put, the variance grows as the square). A response
is a lognormal draw with that mean and deviation, rounded to whole tokens, at least 1
and capped at ``max``: generation stops there (a truncated response). Lognormal because
reasoning-trace lengths are right-skewed with a long tail (DeepSeek-AI 2025, R1 Figure 3;
any distribution with the same two moments would serve the closed forms below).

Responses of batch j are drawn from their own generator seeded by (seed, j), so every
mode sees the same responses (common random numbers) and the draws do not depend on
the order the simulated engines happen to ask for them.

:func:`cdf`, :func:`expected` and :func:`expected_max` are exact for the rounded, capped
distribution; ``tests/test_rl.py`` checks the synchronous loop against them.
"""

import math

import numpy as np

from ..input.scenario import RLLengths


def scale(lengths: RLLengths, step: int) -> float:
    """Growth of mean and sigma by training step ``step`` (0-based)."""
    return (1.0 + lengths.growth) ** step


def lognormal(mean: float, sigma: float) -> tuple[float, float]:
    """(mu, s) of the lognormal whose mean and standard deviation are given:
    s^2 = ln(1 + sigma^2/mean^2), mu = ln(mean) - s^2/2.

    >>> mu, s = lognormal(100.0, 0.0); round(math.exp(mu), 6), s
    (100.0, 0.0)
    """
    s2 = math.log1p((sigma / mean) ** 2)
    return math.log(mean) - s2 / 2, math.sqrt(s2)


def draw(lengths: RLLengths, seed: int, batch: int, n: int, step: int | None = None) -> np.ndarray:
    """``n`` response lengths (tokens, int64) of batch ``batch``, at the lengths of training
    step ``step`` (default: the batch's own step)."""
    k = scale(lengths, batch if step is None else step)
    mu, s = lognormal(lengths.mean * k, lengths.sigma * k)
    rng = np.random.default_rng([seed, batch])
    x = np.exp(mu + s * rng.standard_normal(n)) if s > 0 else np.full(n, math.exp(mu))
    return np.clip(np.rint(x), 1, lengths.max).astype(np.int64)


def cdf(lengths: RLLengths, step: int, k: np.ndarray) -> np.ndarray:
    """P(L <= k) for integers ``k`` at training step ``step``: P(X < k + 1/2) for the
    lognormal X, 0 below 1, 1 from ``max`` on."""
    k = np.asarray(k, dtype=float)
    g = scale(lengths, step)
    mu, s = lognormal(lengths.mean * g, lengths.sigma * g)
    if s > 0:
        z = (np.log(np.maximum(k + 0.5, 1e-300)) - mu) / (s * math.sqrt(2))
        inner = 0.5 * (1.0 + np.vectorize(math.erf)(z))
    else:
        inner = (np.rint(math.exp(mu)) <= k).astype(float)
    return np.where(k < 1, 0.0, np.where(k >= lengths.max, 1.0, inner))


def expected(lengths: RLLengths, step: int) -> float:
    """E[L] = sum over k >= 0 of P(L > k)."""
    k = np.arange(lengths.max)
    return float((1.0 - cdf(lengths, step, k)).sum())


def expected_max(lengths: RLLengths, step: int, n: int) -> float:
    """E[max of n i.i.d. lengths] = sum over k >= 0 of (1 - P(L <= k)^n)."""
    k = np.arange(lengths.max)
    return float((1.0 - cdf(lengths, step, k) ** n).sum())
