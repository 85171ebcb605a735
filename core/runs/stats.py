"""Is a gain real? Welch's t-test over the seeds of two groups of runs, stdlib only.

The challenge's bar for a new record: its val_loss beats the previous one by at least
0.005 nats, shown at p < 0.01 over several runs (seeds). `welch` tests the one-sided
hypothesis "group B's mean is below group A's by more than `margin`": with margin 0 it
is `scipy.stats.ttest_ind(a, b, equal_var=False, alternative="greater")`; with the
challenge's margin it is the same test on a shifted by -margin.

The p-value needs Student's t distribution: its tail is a regularized incomplete beta
function, evaluated by its continued fraction (modified Lentz method) to about 1e-15.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from core.common.errors import PgolfError

__all__ = [
    "RECORD_MARGIN_NATS", "RECORD_P_VALUE", "Welch", "incomplete_beta", "mean_std", "student_t_sf", "welch",
]  # fmt: skip

RECORD_MARGIN_NATS = 0.005  # the improvement a new record must show
RECORD_P_VALUE = 0.01  # at this significance

_TINY = 1e-300
_EPS = 1e-16


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b), valid (fast) for x < (a + 1) / (a + b + 2)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    value = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            value *= c * d
        if abs(c * d - 1.0) < _EPS:
            return value
    raise ArithmeticError(f"incomplete beta: no convergence for x={x}, a={a}, b={b}")


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for 0 <= x <= 1 and a, b > 0."""
    if not (0.0 <= x <= 1.0 and a > 0 and b > 0):
        raise ValueError(f"incomplete beta: x={x}, a={a}, b={b} out of range")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom (df may be fractional)."""
    if math.isnan(t) or df <= 0:
        raise ValueError(f"student t: t={t}, df={df}")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * incomplete_beta(df / (df + t * t), df / 2.0, 0.5)  # P(T > |t|)
    return tail if t >= 0 else 1.0 - tail


@dataclass(frozen=True)
class Welch:
    mean_a: float
    mean_b: float
    std_a: float  # sample standard deviations (n - 1)
    std_b: float
    diff: float  # mean_a - mean_b: how much lower (better) B is
    t: float
    df: float
    p: float  # one-sided: P(a difference this large | B is not better than A by more than the margin)
    margin: float


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n - 1; nan for fewer than 2 values)."""
    xs = [float(v) for v in values]
    mean = math.fsum(xs) / len(xs)
    if len(xs) < 2:
        return mean, math.nan
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in xs) / (len(xs) - 1))


def _mean_var(values: Sequence[float], name: str) -> tuple[float, float]:
    if len(values) < 2:
        raise PgolfError(f"{name} needs at least 2 runs (seeds) for a t-test, got {len(values)}")
    if not all(math.isfinite(float(v)) for v in values):
        raise PgolfError(f"{name} holds a value that is not finite: {list(values)}")
    mean, std = mean_std(values)
    return mean, std * std


def welch(a: Sequence[float], b: Sequence[float], margin: float = 0.0) -> Welch:
    """Welch's one-sided t-test that B's mean is below A's by more than `margin` (lower is better)."""
    mean_a, var_a = _mean_var(a, "group A")
    mean_b, var_b = _mean_var(b, "group B")
    se2_a, se2_b = var_a / len(a), var_b / len(b)
    se = math.sqrt(se2_a + se2_b)
    diff = mean_a - mean_b
    if se == 0.0:  # no spread at all: the answer is certain either way
        t = math.copysign(math.inf, diff - margin) if diff != margin else 0.0
        return Welch(mean_a, mean_b, 0.0, 0.0, diff, t, math.inf, 0.0 if diff > margin else 1.0, margin)
    t = (diff - margin) / se
    df = (se2_a + se2_b) ** 2 / (se2_a**2 / (len(a) - 1) + se2_b**2 / (len(b) - 1))
    return Welch(mean_a, mean_b, math.sqrt(var_a), math.sqrt(var_b), diff, t, df, student_t_sf(t, df), margin)
