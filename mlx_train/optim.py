"""The optimizers in MLX (mirrors cuda_train/optim.py): Muon for the block matrices, AdamW for the rest.

They work on flat `{name: array}` dicts with the canonical state names, so the
state converts to numpy 1:1. The update rules are those of core/model/optim.py; the
groups, learning rates and weight decays come from the parameter table.
Newton-Schulz runs in fp32: bf16 is emulated (slow) on CPUs, and fp32 keeps MLX
within round-off of the numpy reference; on CUDA the PyTorch backend uses bf16
as the challenge's script does.
"""

from __future__ import annotations

import mlx.core as mx

from core.config.fields import Config
from core.model.optim import GROUPS, base_lr, muon_scale, newton_schulz, ns_coefficients, weight_decay
from core.model.params import ParamSpec


class Optimizers:
    """Muon for the matrices, AdamW for the embeddings, head and scalar tensors, and the
    moving average of the weights when `ema_decay` > 0.

    `state` is the flat canonical layout of core.model.backend: "step", "exp_avg/<name>",
    "exp_avg_sq/<name>", "momentum_buffer/<name>" and "ema/<name>".
    """

    def __init__(self, cfg: Config, specs: dict[str, ParamSpec]):
        self.cfg, self.specs = cfg, specs
        self.muon = {name: GROUPS[spec.group].muon for name, spec in specs.items()}
        self.lrs = {name: base_lr(cfg, spec.group) for name, spec in specs.items()}
        self.decays = {name: weight_decay(cfg, spec.group) for name, spec in specs.items()}
        self.coefficients = ns_coefficients(cfg)
        self.state: dict[str, mx.array] = {}
        self.reset()

    def reset(self) -> None:
        self.state.clear()
        self.state["step"] = mx.array(0, dtype=mx.int64)
        for name, spec in self.specs.items():
            keys = ("momentum_buffer",) if self.muon[name] else ("exp_avg", "exp_avg_sq")
            keys += ("ema",) if self.cfg.ema_decay > 0 else ()
            for key in keys:
                self.state[f"{key}/{name}"] = mx.zeros(spec.shape, dtype=mx.float32)

    def apply(
        self,
        params: dict[str, mx.array],
        grads: dict[str, mx.array],
        lr_mult: mx.array,
        momentum: mx.array,
        muon_wd_mult: mx.array | float = 1.0,
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
            if self.muon[name]:
                buf = momentum * s[f"momentum_buffer/{name}"] + g
                s[f"momentum_buffer/{name}"] = buf
                update = newton_schulz(g + momentum * buf, self.coefficients, cfg.muon_row_normalize)
                update = update * muon_scale(*p.shape)
            else:
                m = cfg.beta1 * s[f"exp_avg/{name}"] + (1.0 - cfg.beta1) * g
                v = cfg.beta2 * s[f"exp_avg_sq/{name}"] + (1.0 - cfg.beta2) * g * g
                s[f"exp_avg/{name}"], s[f"exp_avg_sq/{name}"] = m, v
                # torch.optim.AdamW's form: eps is added after the bias-corrected sqrt.
                update = (m / bias1) / (mx.sqrt(v) / mx.sqrt(bias2) + cfg.adam_eps)
            new = p.astype(mx.float32)
            if self.decays[name]:
                decay = self.decays[name] * muon_wd_mult if self.muon[name] else self.decays[name]
                new = new * (1.0 - lr * decay)
            out[name] = (new - lr * update).astype(p.dtype)
            if cfg.ema_decay > 0:
                ema = s[f"ema/{name}"]
                s[f"ema/{name}"] = ema * cfg.ema_decay + out[name].astype(mx.float32) * (1.0 - cfg.ema_decay)
        return out

    def reset_ema(self, params: dict[str, mx.array]) -> None:
        """Start the moving average at these weights."""
        for name in self.specs if self.cfg.ema_decay > 0 else ():
            self.state[f"ema/{name}"] = params[name].astype(mx.float32)
