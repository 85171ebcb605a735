"""The canonical optimizer state's layout (core.model.backend), as a checkpoint holds it: what resuming
checks a checkpoint against and the memory estimate counts. A training run does not read it."""

from __future__ import annotations

from core.config.fields import Config
from core.model.params import param_specs


def optimizer_state_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The canonical optimizer state of `core.model.backend`: a step counter, then Muon
    momentum for matrices and Adam moments for everything else, and the moving
    average of the weights when `ema_decay` > 0, each shaped like its parameter."""
    shapes: dict[str, tuple[int, ...]] = {"step": ()}
    for name, spec in param_specs(cfg).items():
        keys = ("momentum_buffer",) if spec.group == "matrix" else ("exp_avg", "exp_avg_sq")
        keys += ("ema",) if cfg.ema_decay > 0 else ()
        shapes.update({f"{key}/{name}": spec.shape for key in keys})
    return shapes
