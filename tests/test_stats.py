"""Welch's t-test of core/runs/stats.py: scipy's, with the challenge's margin and the no-spread case."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from core.common.errors import PgolfError
from core.runs.stats import RECORD_MARGIN_NATS, welch
from tests.support.cli import cli, data_flags

scipy_stats = pytest.importorskip("scipy.stats")


def _groups():
    value = st.floats(2.0, 4.0, allow_nan=False)
    return st.lists(value, min_size=2, max_size=6, unique=True)


# One group at round-off spread beside one with a real spread: scipy warns, but the other's spread decides t.
@pytest.mark.filterwarnings("ignore:Precision loss occurred in moment calculation:RuntimeWarning")
@settings(max_examples=200, deadline=None)
@given(_groups(), _groups(), st.sampled_from([0.0, RECORD_MARGIN_NATS]))
def test_welch_matches_scipy(a, b, margin):
    # scipy takes the margin off each value, rounding each by up to 2e-16: where both groups' spread is
    # near that ([2.0, 2.0000000000000004]), its t is round-off (scipy warns), and so would pgolf's be.
    assume(max(np.std(a), np.std(b)) > 1e-6)
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


@pytest.mark.slow
def test_seeds_make_groups_and_compare_agrees_with_scipy(sotu_dataset, tmp_path):
    """Two groups of two smoke runs (2 steps) at different learning rates: runs --compare's p-value
    is scipy's Welch test on the runs' val_loss, to 1e-9."""
    from core.runs.summary import find_runs, summarize

    pytest.importorskip("torch")
    common = ["--backend", "cuda", "--preset", "smoke", "--iterations", "2", "--val-loss-every", "0",
              "--val-max-tokens", "8192", "--out-dir", str(tmp_path), *data_flags(sotu_dataset)]  # fmt: skip
    for group, lr in (("slow_lr", "0.004"), ("fast_lr", "0.04")):
        result = cli("train", *common, "--seeds", "1,2", "--run-group", group, "--matrix-lr", lr)
        assert result.returncode == 0, result.stderr
    summaries = [summarize(p) for p in find_runs(tmp_path)]
    assert sorted(s.name for s in summaries) == sorted(
        f"{g}-seed{n}" for g in ("slow_lr", "fast_lr") for n in (1, 2)
    )
    table = cli("runs", "--out-dir", str(tmp_path))
    assert re.search(r"fast_lr +│ +2 │ 1,2 ", table.stdout), table.stdout
    result = cli("runs", "--out-dir", str(tmp_path), "--compare", "slow_lr", "fast_lr", "--json")
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    loss = {g: [s.score_val_loss for s in summaries if s.group == g] for g in ("slow_lr", "fast_lr")}
    ref = scipy_stats.ttest_ind(loss["slow_lr"], loss["fast_lr"], equal_var=False, alternative="greater")
    assert got["gain"]["p"] == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-12)
    assert got["diff_nats"] == pytest.approx(np.mean(loss["slow_lr"]) - np.mean(loss["fast_lr"]), abs=1e-12)
    shifted = scipy_stats.ttest_ind(np.array(loss["slow_lr"]) - RECORD_MARGIN_NATS, loss["fast_lr"],
                                    equal_var=False, alternative="greater")  # fmt: skip
    assert got["record_bar"]["p"] == pytest.approx(shifted.pvalue, rel=1e-9, abs=1e-12)
    assert got["meets_record_bar"] == (shifted.pvalue < 0.01)
    text = cli("runs", "--out-dir", str(tmp_path), "--compare", "slow_lr", "fast_lr")
    assert "A - B:" in text.stdout and "challenge's bar" in text.stdout
    missing = cli("runs", "--out-dir", str(tmp_path), "--compare", "slow_lr", "nope")
    assert missing.returncode == 1 and "no finished runs in group 'nope'" in missing.stderr
