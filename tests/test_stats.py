"""Welch's t-test of core/stats.py against scipy's, and the pieces it stands on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import PgolfError
from core.stats import RECORD_MARGIN_NATS, incomplete_beta, student_t_sf, welch

scipy_stats = pytest.importorskip("scipy.stats")
scipy_special = pytest.importorskip("scipy.special")


@pytest.mark.parametrize("x", [1e-9, 0.01, 0.3, 0.5, 0.77, 0.999999])
@pytest.mark.parametrize(
    ("a", "b"), [(0.5, 0.5), (1.0, 0.5), (2.5, 0.5), (30.0, 0.5), (3.0, 7.0), (200.0, 0.5)]
)
def test_incomplete_beta_matches_scipy(x, a, b):
    assert incomplete_beta(x, a, b) == pytest.approx(scipy_special.betainc(a, b, x), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("t", [-40.0, -3.2, -0.5, 0.0, 0.1, 1.7, 6.0, 60.0])
@pytest.mark.parametrize("df", [1.0, 1.37, 2.0, 3.9, 10.0, 250.5])
def test_student_t_tail_matches_scipy(t, df):
    assert student_t_sf(t, df) == pytest.approx(scipy_stats.t.sf(t, df), rel=1e-10, abs=1e-15)


def _groups():
    value = st.floats(2.0, 4.0, allow_nan=False)
    return st.lists(value, min_size=2, max_size=6, unique=True)


@settings(max_examples=200, deadline=None)
@given(_groups(), _groups(), st.sampled_from([0.0, RECORD_MARGIN_NATS]))
def test_welch_matches_scipy(a, b, margin):
    got = welch(a, b, margin)
    ref = scipy_stats.ttest_ind(np.array(a) - margin, b, equal_var=False, alternative="greater")
    assert got.t == pytest.approx(ref.statistic, rel=1e-9, abs=1e-12)
    assert got.p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-9)
    assert got.diff == pytest.approx(np.mean(a) - np.mean(b), abs=1e-12)


def test_three_seeds_each_the_way_records_report_them():
    old = [1.0920, 1.0934, 1.0927]  # nats, a record's three seeds (made up)
    new = [1.0840, 1.0852, 1.0846]
    result = welch(old, new, RECORD_MARGIN_NATS)
    ref = scipy_stats.ttest_ind(
        np.array(old) - RECORD_MARGIN_NATS, new, equal_var=False, alternative="greater"
    )
    assert result.p == pytest.approx(ref.pvalue, rel=1e-9) and result.p < 0.01
    assert welch(old, old[::-1]).p == pytest.approx(0.5)  # same groups: no evidence either way


def test_too_few_runs_or_bad_values_are_refused():
    with pytest.raises(PgolfError, match="group A needs at least 2 runs"):
        welch([1.0], [1.0, 2.0])
    with pytest.raises(PgolfError, match="not finite"):
        welch([1.0, math.nan], [1.0, 2.0])
    exact = welch([1.0, 1.0], [0.9, 0.9], margin=0.05)
    assert exact.p == 0.0 and exact.t == math.inf
