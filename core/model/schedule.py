"""Learning-rate, weight-decay and momentum schedules: pure functions of the step and the clock."""

from __future__ import annotations

from core.config.fields import Config


def training_progress(cfg: Config, step: int, elapsed_ms: float) -> float:
    """How far training has come, 0 at the start and 1 at the end: the share of the
    iterations taken, or under a wallclock cap the share of the cap used (may pass 1). The cap is
    `Config.train_cap_seconds`: the wallclock cap less any time reserved for GPTQ's calibration."""
    if cfg.train_cap_seconds > 0:
        return elapsed_ms / (1000.0 * cfg.train_cap_seconds)
    return step / max(cfg.iterations, 1)


def looping_active(cfg: Config, step: int, elapsed_ms: float) -> bool:
    """Whether the looped layers run at `step`: from `enable_looping_at` of training on, for good
    (progress only grows, so a resumed run recomputes the same answer)."""
    return cfg.num_loops > 0 and training_progress(cfg, step, elapsed_ms) >= cfg.enable_looping_at


def lr_multiplier(cfg: Config, step: int, elapsed_ms: float) -> float:
    """Factor applied to every base lr at `step`: no warmup, then a linear warmdown to `min_lr`.

    With `warmdown_frac` > 0 the warmdown is the last fraction of the run, measured
    in steps (no wallclock cap) or in training time (against the cap): the
    multiplier is (1 - progress) / warmdown_frac once progress >= 1 - warmdown_frac.
    Otherwise it covers the last `warmdown_iters` steps, or, under a cap, the last
    `warmdown_iters` average step times before it (remaining_ms / window).
    """
    if cfg.warmdown_frac > 0:
        progress = training_progress(cfg, step, elapsed_ms)
        if progress < 1.0 - cfg.warmdown_frac:
            return 1.0
        return max((1.0 - progress) / cfg.warmdown_frac, cfg.min_lr)
    if cfg.warmdown_iters <= 0:
        return 1.0
    if cfg.train_cap_seconds <= 0:  # steps are never negative, warmdown_iters here at least 1
        if cfg.iterations - cfg.warmdown_iters <= step < cfg.iterations:
            return max((cfg.iterations - step) / cfg.warmdown_iters, cfg.min_lr)
        return 1.0
    window_ms = cfg.warmdown_iters * (elapsed_ms / max(step, 1))
    remaining_ms = max(1000.0 * cfg.train_cap_seconds - elapsed_ms, 0.0)
    return max(remaining_ms / max(window_ms, 1e-9), cfg.min_lr) if remaining_ms <= window_ms else 1.0


def muon_momentum(cfg: Config, step: int) -> float:
    """Muon momentum, warming up linearly from the start value over the warmup steps."""
    if cfg.muon_momentum_warmup_steps <= 0:
        return cfg.muon_momentum
    frac = min(step / cfg.muon_momentum_warmup_steps, 1.0)
    return (1.0 - frac) * cfg.muon_momentum_warmup_start + frac * cfg.muon_momentum


def muon_wd_multiplier(cfg: Config, step: int, elapsed_ms: float) -> float:
    """Factor on Muon's weight decay (the 2026-04-18 taper): 1 until `wd_taper_start_frac` of training,
    then linear to `wd_taper_final_mult` at its end (progress as for the lr warmdown)."""
    start = cfg.wd_taper_start_frac
    progress = training_progress(cfg, step, elapsed_ms)
    if start >= 1.0 or progress <= start:
        return 1.0
    done = min((progress - start) / (1.0 - start), 1.0)
    return 1.0 + (cfg.wd_taper_final_mult - 1.0) * done
