"""Optimizer facts both backends implement: the groups, Muon's orthogonalisation, its coefficients, and the
canonical optimizer state a checkpoint holds.

Muon (for the 2-D block matrices): b = mu*b + g; u = g + mu*b (Nesterov);
optionally each row of u scaled to unit norm (MuonEq-R); X = u / (||u||_F + NS_EPS),
transposed when rows > cols; one polynomial step X <- a X + (b A + c A A) X with
A = X X^T per coefficient triple (the baseline's quintic, or Polar Express); update scaled by sqrt(max(1, rows/cols));
p <- p * (1 - lr * wd) - lr * update. Everything else uses Adam (decoupled weight
decay, as torch.optim.AdamW, when the group's decay is not zero).

`newton_schulz` is written once, here, with numpy-style operators only (`@`, `*`,
`.T`, `.sum`), so it runs unchanged on numpy, torch and MLX arrays; each backend
only picks the dtype it runs in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core.config.fields import Config
from core.model.params import param_specs

NS_EPS = 1e-7  # added to the Frobenius norm before normalising
ROW_EPS = 1e-7  # the least row norm MuonEq-R divides by

# The quintic of the challenge's baseline, the same triple at every step.
QUINTIC = (3.4445, -4.7750, 2.0315)
# Polar Express: one triple per step, for at most five steps (record 2026-04-23's values).
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


@dataclass(frozen=True)
class Group:
    """How the parameters of one group of core.model.params are trained."""

    muon: bool  # Muon (2-D matrices) or Adam
    lr_field: str  # the Config field holding the base learning rate
    wd_field: str | None  # the Config field holding the decoupled weight decay, if any


GROUPS = {
    "embed": Group(muon=False, lr_field="tied_embed_lr", wd_field="embed_wd"),
    "head": Group(muon=False, lr_field="head_lr", wd_field=None),
    "matrix": Group(muon=True, lr_field="matrix_lr", wd_field="muon_wd"),
    "scalar": Group(muon=False, lr_field="scalar_lr", wd_field="adam_wd"),
}


def base_lr(cfg: Config, group: str) -> float:
    """Base learning rate of an optimizer group (the untied embedding has its own)."""
    if group == "embed" and not cfg.tie_embeddings:
        return cfg.embed_lr
    return getattr(cfg, GROUPS[group].lr_field)


def weight_decay(cfg: Config, group: str) -> float:
    field = GROUPS[group].wd_field
    return 0.0 if field is None else getattr(cfg, field)


def muon_scale(rows: int, cols: int) -> float:
    """Shape correction so tall matrices get updates of comparable size."""
    return math.sqrt(max(1.0, rows / cols))


def ns_coefficients(cfg: Config) -> tuple[tuple[float, float, float], ...]:
    """One (a, b, c) triple per Newton-Schulz step: the quintic muon_backend_steps times, or the
    first muon_backend_steps Polar Express triples (five at most, as the record runs them)."""
    if cfg.muon_ns_coefficients == "polar_express":
        return POLAR_EXPRESS[: cfg.muon_backend_steps]
    return (QUINTIC,) * cfg.muon_backend_steps


def newton_schulz(
    g: Any, coefficients: tuple[tuple[float, float, float], ...], row_normalize: bool = False
) -> Any:
    """Approximately orthogonalise a 2-D array (numpy, torch or MLX) in the dtype it arrives in."""
    if row_normalize:  # each row divided by max(its norm, ROW_EPS)
        norms = (g * g).sum(axis=-1, keepdims=True) ** 0.5
        g = g / (norms + (norms < ROW_EPS) * (ROW_EPS - norms))
    x = g / ((g * g).sum() ** 0.5 + NS_EPS)
    transposed = g.shape[0] > g.shape[1]
    if transposed:
        x = x.T
    for a, b, c in coefficients:
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if transposed else x


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
