"""Schedules are pure functions: check them at their edges."""

from __future__ import annotations

import pytest

from core.config.presets import preset
from core.model.schedule import looping_active, lr_multiplier, muon_momentum, training_progress


def test_iteration_warmdown_edges():
    cfg = preset("baseline").replace(iterations=100, warmdown_iters=20, max_wallclock_seconds=0)
    assert lr_multiplier(cfg, 0, 0.0) == 1.0
    assert lr_multiplier(cfg, 79, 0.0) == 1.0
    assert lr_multiplier(cfg, 80, 0.0) == pytest.approx(1.0)  # first warmdown step: 20/20
    assert lr_multiplier(cfg, 90, 0.0) == pytest.approx(0.5)
    assert lr_multiplier(cfg, 99, 0.0) == pytest.approx(0.05)
    assert lr_multiplier(cfg, 100, 0.0) == 1.0  # past the end: no decay is applied any more


def test_warmdown_longer_than_training_starts_decayed():
    cfg = preset("baseline").replace(iterations=10, warmdown_iters=20, max_wallclock_seconds=0)
    assert lr_multiplier(cfg, 0, 0.0) == pytest.approx(0.5)


def test_no_warmdown_means_constant():
    cfg = preset("baseline").replace(warmdown_iters=0)
    assert lr_multiplier(cfg, 5, 123.0) == 1.0


def test_wallclock_warmdown():
    # 10 s cap; 100 ms per step so far; a warmdown of 20 steps is a 2 s window.
    cfg = preset("baseline").replace(max_wallclock_seconds=10.0, warmdown_iters=20)
    assert lr_multiplier(cfg, 50, 5_000.0) == 1.0  # 5 s left > 2 s window
    assert lr_multiplier(cfg, 80, 8_000.0) == pytest.approx(1.0)  # exactly at the window
    assert lr_multiplier(cfg, 90, 9_000.0) == pytest.approx(0.5)
    assert lr_multiplier(cfg, 100, 10_000.0) == 0.0
    assert lr_multiplier(cfg, 110, 11_000.0) == 0.0  # past the cap: never negative


def test_wallclock_step_zero_uses_elapsed_as_step_time():
    cfg = preset("baseline").replace(max_wallclock_seconds=1.0, warmdown_iters=10)
    # step 0: the step time estimate is the elapsed time itself (max(step, 1)).
    assert lr_multiplier(cfg, 0, 200.0) == pytest.approx(800.0 / 2000.0)


def test_muon_momentum_warmup():
    cfg = preset("baseline")
    assert muon_momentum(cfg, 0) == pytest.approx(0.85)
    assert muon_momentum(cfg, 250) == pytest.approx(0.90)
    assert muon_momentum(cfg, 500) == pytest.approx(0.95)
    assert muon_momentum(cfg, 10_000) == pytest.approx(0.95)
    assert muon_momentum(cfg.replace(muon_momentum_warmup_steps=0), 0) == 0.95


def test_training_progress_is_steps_or_the_share_of_the_cap():
    by_steps = preset("baseline").replace(iterations=200, max_wallclock_seconds=0)
    assert training_progress(by_steps, 50, 1e9) == 0.25  # the clock does not count without a cap
    capped = preset("baseline").replace(max_wallclock_seconds=10.0)
    assert training_progress(capped, 1_000_000, 2_500.0) == 0.25
    assert training_progress(capped, 0, 12_000.0) == 1.2  # overshoot past the cap


def test_gptq_reserve_comes_off_the_cap():
    """Calibration happens inside the training budget: the schedules and the stop read the cap less
    the reserve (the records' effective cap)."""
    cfg = preset("baseline").replace(max_wallclock_seconds=600.0, quant_format="mixed", gptq_enabled=True)
    assert cfg.train_cap_seconds == 590.0
    assert training_progress(cfg, 0, 295_000.0) == 0.5
    assert cfg.replace(gptq_enabled=False).train_cap_seconds == 600.0
    assert cfg.replace(max_wallclock_seconds=0.0).train_cap_seconds == 0.0  # no cap, nothing to reserve
    assert lr_multiplier(cfg.replace(warmdown_frac=0.5), 0, 590_000.0 * 0.75) == pytest.approx(0.5)


def test_warmdown_frac_reads_the_shared_progress():
    cfg = preset("baseline").replace(warmdown_frac=0.5, min_lr=0.1, max_wallclock_seconds=10.0)
    assert lr_multiplier(cfg, 0, 4_000.0) == 1.0
    assert lr_multiplier(cfg, 0, 7_500.0) == pytest.approx(0.5)
    assert lr_multiplier(cfg, 0, 9_900.0) == pytest.approx(0.1)  # the floor


def test_looping_switches_on_at_its_fraction_for_good():
    cfg = preset("baseline").replace(
        iterations=100, max_wallclock_seconds=0, num_loops=2, enable_looping_at=0.35
    )
    assert [looping_active(cfg, s, 0.0) for s in (0, 34, 35, 36, 99, 100)] == [
        False,
        False,
        True,
        True,
        True,
        True,
    ]
    assert not looping_active(cfg.replace(num_loops=0), 99, 0.0)
    assert looping_active(cfg.replace(enable_looping_at=0.0), 0, 0.0)
    capped = cfg.replace(max_wallclock_seconds=10.0)
    assert not looping_active(capped, 99, 3_499.0) and looping_active(capped, 0, 3_500.0)
