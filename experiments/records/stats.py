"""Student's t for the comparisons: the two-sided 95% quantile at any degrees of freedom
(Welch-Satterthwaite's are fractional), from the regularized incomplete beta function, so
that the records need nothing beyond the standard library."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """A difference of means, the half-width of its 95% confidence interval, and how it was
    computed: ``test`` "paired t" or "Welch t", ``df`` its degrees of freedom."""

    diff: float
    half_width: float
    test: str
    df: float


def paired_t(a: list[float], b: list[float]) -> Interval:
    """``b − a`` over matched pairs (the same seed, machine and trainer): the mean of the
    per-pair differences, t at n − 1 degrees of freedom. At least two pairs."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    df = len(d) - 1
    se = statistics.stdev(d) / math.sqrt(len(d))
    return Interval(statistics.mean(d), t_quantile(df) * se, "paired t", df)


def welch_t(a: list[float], b: list[float]) -> Interval:
    """``mean(b) − mean(a)`` of two independent arms of at least two values each: the standard
    error from each arm's variance, t at Welch-Satterthwaite's degrees of freedom."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:  # both arms constant: nothing to scale the difference by
        df = float(len(a) + len(b) - 2)
    else:
        df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    diff = statistics.mean(b) - statistics.mean(a)
    return Interval(diff, t_quantile(df) * se, "Welch t", df)


def t_quantile(df: float, two_sided: float = 0.95) -> float:
    """The t with P(|T| ≤ t) = ``two_sided`` for Student's T at ``df`` degrees of freedom
    (4.303 at 2, 2.776 at 4, 1.960 as df grows), by bisection on the distribution function."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = 1 - two_sided  # both tails together
    lo, hi = 0.0, 1.0
    while _two_tails(hi, df) > tail:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _two_tails(mid, df) > tail else (lo, mid)
    return (lo + hi) / 2


def _two_tails(t: float, df: float) -> float:
    """P(|T| > t) = I_x(df/2, 1/2) with x = df / (df + t²)."""
    return _incomplete_beta(df / 2, 0.5, df / (df + t * t))


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction
    (Numerical Recipes' betacf, Lentz's method), on the side where it converges fast."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _fraction(a, b, x) / a
    return 1 - math.exp(log_front) * _fraction(b, a, 1 - x) / b


def _fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h
