"""Is a gain real? Welch's t-test over the seeds of two groups of runs (scipy's).

The challenge's bar for a new record: its val_loss beats the previous one by at least
0.005 nats, shown at p < 0.01 over several runs (seeds). `welch` tests the one-sided
hypothesis "group B's mean is below group A's by more than `margin`": with margin 0 it
is `scipy.stats.ttest_ind(a, b, equal_var=False, alternative="greater")`; with the
challenge's margin it is the same test on a shifted by -margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from core.common.errors import PgolfError

__all__ = ["RECORD_MARGIN_NATS", "RECORD_P_VALUE", "Welch", "mean_std", "welch"]

RECORD_MARGIN_NATS = 0.005  # the improvement a new record must show
RECORD_P_VALUE = 0.01  # at this significance


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
    """The mean and the sample standard deviation (n - 1; nan for fewer than 2 values). Values past
    float's range in their sum or squares give inf, never an OverflowError."""
    xs = [float(v) for v in values]
    mean = _sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, math.nan
    return mean, math.sqrt(_sum([(v - mean) * (v - mean) for v in xs]) / (len(xs) - 1))


def _sum(xs: list[float]) -> float:
    try:
        return math.fsum(xs)
    except (OverflowError, ValueError):  # an intermediate sum past float's range (ValueError: inf - inf)
        return sum(xs)


def _checked(values: Sequence[float], name: str) -> list[float]:
    if len(values) < 2:
        raise PgolfError(f"{name} needs at least 2 runs (seeds) for a t-test, got {len(values)}")
    if not all(math.isfinite(float(v)) for v in values):
        raise PgolfError(f"{name} holds a value that is not finite: {list(values)}")
    return [float(v) for v in values]


def welch(a: Sequence[float], b: Sequence[float], margin: float = 0.0) -> Welch:
    """Welch's one-sided t-test that B's mean is below A's by more than `margin` (lower is better)."""
    xs, ys = _checked(a, "group A"), _checked(b, "group B")
    (mean_a, std_a), (mean_b, std_b) = mean_std(xs), mean_std(ys)
    diff = mean_a - mean_b
    if std_a == std_b == 0.0:  # no spread at all (scipy answers nan): the answer is certain either way
        t = math.copysign(math.inf, diff - margin) if diff != margin else 0.0
        return Welch(mean_a, mean_b, 0.0, 0.0, diff, t, math.inf, 0.0 if diff > margin else 1.0, margin)
    from scipy.stats import t as student_t

    # scipy's ttest_ind(xs - margin, ys, equal_var=False, alternative="greater"), with the margin taken off
    # the means rather than each value: a margin far larger than the values (1e308) leaves their spread.
    var_a, var_b = std_a * std_a / len(xs), std_b * std_b / len(ys)
    t = (diff - margin) / math.sqrt(var_a + var_b)
    df = (var_a + var_b) * (var_a + var_b) / (var_a * var_a / (len(xs) - 1) + var_b * var_b / (len(ys) - 1))
    return Welch(mean_a, mean_b, std_a, std_b, diff, t, df, float(student_t.sf(t, df)), margin)
