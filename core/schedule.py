"""Learning-rate and momentum schedules: pure functions of the step and the clock."""

from __future__ import annotations

from core.config import Config


def lr_multiplier(cfg: Config, step: int, elapsed_ms: float) -> float:
    """Factor applied to every base lr at `step` (no warmup, linear warmdown to 0).

    Without a wallclock cap the warmdown covers the last `warmdown_iters` steps.
    With a cap it covers the last `warmdown_iters` average step times before the
    cap: the multiplier is remaining_ms / window once remaining_ms <= window.
    """
    if cfg.warmdown_iters <= 0:
        return 1.0
    if cfg.max_wallclock_seconds <= 0:
        start = max(cfg.iterations - cfg.warmdown_iters, 0)
        if start <= step < cfg.iterations:
            return max((cfg.iterations - step) / max(cfg.warmdown_iters, 1), 0.0)
        return 1.0
    window_ms = cfg.warmdown_iters * (elapsed_ms / max(step, 1))
    remaining_ms = max(1000.0 * cfg.max_wallclock_seconds - elapsed_ms, 0.0)
    return remaining_ms / max(window_ms, 1e-9) if remaining_ms <= window_ms else 1.0


def muon_momentum(cfg: Config, step: int) -> float:
    """Muon momentum, warming up linearly from the start value over the warmup steps."""
    if cfg.muon_momentum_warmup_steps <= 0:
        return cfg.muon_momentum
    frac = min(step / cfg.muon_momentum_warmup_steps, 1.0)
    return (1.0 - frac) * cfg.muon_momentum_warmup_start + frac * cfg.muon_momentum
