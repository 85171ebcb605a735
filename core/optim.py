"""Optimizer facts both backends implement: Muon's Newton-Schulz and the lr of each group.

Muon (for the 2-D block matrices): b = mu*b + g; u = g + mu*b (Nesterov);
X = u / (||u||_F + NS_EPS), transposed when rows > cols; NS_STEPS quintic
iterations X <- a X + (b A + c A A) X with A = X X^T; update scaled by
sqrt(max(1, rows/cols)); p -= lr * update. Everything else uses Adam.
"""

from __future__ import annotations

import math

from core.config import Config

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # quintic Newton-Schulz (a, b, c)
NS_EPS = 1e-7  # added to the Frobenius norm before normalising


def muon_scale(rows: int, cols: int) -> float:
    """Shape correction so tall matrices get updates of comparable size."""
    return math.sqrt(max(1.0, rows / cols))


def base_lr(cfg: Config, group: str) -> float:
    """Base learning rate of an optimizer group from core.params.param_group."""
    if group == "embed":
        return cfg.tied_embed_lr if cfg.tie_embeddings else cfg.embed_lr
    if group == "head":
        return cfg.head_lr
    if group == "matrix":
        return cfg.matrix_lr
    if group == "scalar":
        return cfg.scalar_lr
    raise ValueError(f"unknown optimizer group {group!r}")
