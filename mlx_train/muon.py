"""Muon and Adam for MLX, on flat `{name: array}` dicts, with the canonical state names.

The update rules are those of cuda_train/muon.py and SPEC section 5. Newton-Schulz
runs in fp32: bf16 is emulated (slow) on CPUs, and fp32 keeps MLX within round-off
of the numpy reference; on CUDA the PyTorch backend uses bf16 as upstream does.
"""

from __future__ import annotations

import mlx.core as mx

from core.config import Config
from core.optim import NS_COEFFS, NS_EPS, base_lr, muon_scale
from core.params import param_group, param_shapes


def newton_schulz(g: mx.array, steps: int) -> mx.array:
    """Approximately orthogonalise a matrix with the quintic Newton-Schulz iteration."""
    a, b, c = NS_COEFFS
    x = g.astype(mx.float32)
    x = x / (mx.sqrt(mx.sum(x * x)) + NS_EPS)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if transposed else x


class Optimizers:
    """Muon for the block matrices, Adam for the embedding, head and scalar tensors.

    `state` is the flat canonical layout of core.backend: "step", "exp_avg/<name>",
    "exp_avg_sq/<name>" and "momentum_buffer/<name>", so it converts to numpy 1:1.
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.groups = {name: param_group(name) for name in param_shapes(cfg)}
        self.lrs = {name: base_lr(cfg, group) for name, group in self.groups.items()}
        self.state: dict[str, mx.array] = {}
        self.reset()

    def reset(self) -> None:
        self.state.clear()
        self.state["step"] = mx.array(0, dtype=mx.int64)
        for name, shape in param_shapes(self.cfg).items():
            if self.groups[name] == "matrix":
                self.state[f"momentum_buffer/{name}"] = mx.zeros(shape, dtype=mx.float32)
            else:
                self.state[f"exp_avg/{name}"] = mx.zeros(shape, dtype=mx.float32)
                self.state[f"exp_avg_sq/{name}"] = mx.zeros(shape, dtype=mx.float32)

    def apply(
        self, params: dict[str, mx.array], grads: dict[str, mx.array], lr_mult: mx.array, momentum: mx.array
    ) -> dict[str, mx.array]:
        """New parameters after one step; updates `self.state` in place (compile-friendly)."""
        cfg, s = self.cfg, self.state
        step = s["step"] + 1
        s["step"] = step
        t = step.astype(mx.float32)
        bias1, bias2 = 1.0 - cfg.beta1**t, 1.0 - cfg.beta2**t
        out = {}
        for name, p in params.items():
            g = grads[name].astype(mx.float32)
            lr = self.lrs[name] * lr_mult
            if self.groups[name] == "matrix":
                buf = momentum * s[f"momentum_buffer/{name}"] + g
                s[f"momentum_buffer/{name}"] = buf
                update = newton_schulz(g + momentum * buf, cfg.muon_backend_steps)
                update = update * muon_scale(*p.shape)
            else:
                m = cfg.beta1 * s[f"exp_avg/{name}"] + (1.0 - cfg.beta1) * g
                v = cfg.beta2 * s[f"exp_avg_sq/{name}"] + (1.0 - cfg.beta2) * g * g
                s[f"exp_avg/{name}"], s[f"exp_avg_sq/{name}"] = m, v
                # torch.optim.Adam's form: eps is added after the bias-corrected sqrt.
                update = (m / bias1) / (mx.sqrt(v) / mx.sqrt(bias2) + cfg.adam_eps)
            out[name] = (p.astype(mx.float32) - lr * update).astype(p.dtype)
        return out
