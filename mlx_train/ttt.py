"""Test-time training's device side on MLX (core/eval/ttt.py runs it): LoRA adapters
scored then trained chunk by chunk, and SGD on the model's own weights, on the model of the backend
that makes it (`MLXBackend.ttt`), through what `TTTHost` names of it; cuda_train/ttt.py is PyTorch's.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from core.config.fields import Config
from core.model.lora import adapter_shapes
from mlx_train.model import GPT


class TTTHost(Protocol):
    """What test-time training uses of the backend that makes it."""

    cfg: Config
    model: GPT
    looping: bool
    world_size: int
    group: Any  # the distributed group of its collectives


class MLXTTT:
    """The operations of core.model.backend's `TTT` on a backend's model, for one evaluation."""

    def __init__(self, backend: TTTHost):
        self.backend, self.cfg, self.model = backend, backend.cfg, backend.model

    def new_adapters(self, a: dict[str, np.ndarray]) -> MLXAdapters:
        return MLXAdapters(self.cfg, a)

    def restart_adapters(self, adapters: MLXAdapters, a: dict[str, np.ndarray] | None = None) -> None:
        adapters.restart(a)

    def score_then_adapt(
        self,
        adapters: MLXAdapters,
        x: np.ndarray,
        y: np.ndarray,
        train_rows: np.ndarray,
        train_from: int,
        train_len: int,
    ) -> np.ndarray:
        model, looping = self.model, self.backend.looping
        xs, ys = mx.array(x), mx.array(y)
        steps = self.cfg.ttt_grad_steps if train_rows.any() else 0
        if steps == 0:
            return np.array(model.token_losses(xs, ys, looping, adapters.pairs).astype(mx.float32))
        rows = mx.array(np.asarray(train_rows, dtype=np.float32))

        def loss(pairs: dict, xs: mx.array, ys: mx.array) -> tuple[mx.array, mx.array]:
            nll = model.token_losses(xs, ys, looping, pairs)
            return (nll[:, train_from : train_from + train_len].mean(axis=-1) * rows).sum(), nll

        grad = mx.value_and_grad(loss)
        scored = None
        for _ in range(steps):
            (_, nll), grads = grad(adapters.pairs, xs, ys)
            if scored is None:
                scored = np.array(nll.astype(mx.float32))  # before any step has seen the chunk
            adapters.step(grads)
        return scored

    def sgd_reset(self, momentum: float, frozen: tuple[str, ...] = ()) -> None:
        self._sgd_momentum, self._sgd_frozen = momentum, frozen
        self._sgd_buffers: dict[str, mx.array] = {}

    def sgd_step(
        self, x: np.ndarray, y: np.ndarray, lr: float, total_tokens: int, clip: float, doc_mask: bool = True
    ) -> None:
        backend, model = self.backend, self.model
        params = {k: p for k, p in tree_flatten(model.parameters()) if not k.startswith(self._sgd_frozen)}
        if x.shape[0]:

            def loss(xs: mx.array, ys: mx.array) -> mx.array:
                return model.token_losses(xs, ys, backend.looping).sum() / total_tokens

            with model.walk.plain_causal(not doc_mask):
                _, tree = nn.value_and_grad(model, loss)(mx.array(x), mx.array(y))
            grads = {k: g.astype(mx.float32) for k, g in tree_flatten(tree) if k in params}
        else:
            grads = {k: mx.zeros(p.shape, dtype=mx.float32) for k, p in params.items()}
        if backend.world_size > 1:
            grads = {k: mx.distributed.all_sum(g, group=backend.group) for k, g in grads.items()}
        if clip > 0:
            norm = mx.sqrt(sum(mx.sum(g * g) for g in grads.values()))
            grads = {k: g * mx.minimum(clip / (norm + 1e-6), 1.0) for k, g in grads.items()}
        new = []
        for k, g in grads.items():
            buf = self._sgd_buffers.get(k)
            buf = g if buf is None else self._sgd_momentum * buf + g
            self._sgd_buffers[k] = buf
            new.append((k, (params[k].astype(mx.float32) - lr * buf).astype(params[k].dtype)))
        model.update(tree_unflatten(new))
        mx.eval(model.parameters(), self._sgd_buffers)


class MLXAdapters:
    """LoRA adapters (core/model/lora.py) as fp32 arrays, and their optimizer's state: AdamW with bias
    correction as PyTorch's, or SGD with momentum (`ttt_optimizer`)."""

    def __init__(self, cfg: Config, a: dict[str, np.ndarray]):
        self.cfg = cfg
        shapes = adapter_shapes(cfg, next(iter(a.values())).shape[0])
        self.pairs = {name: (mx.array(a[name]), mx.zeros(b_shape)) for name, (_, b_shape) in shapes.items()}
        self.restart(None)

    def restart(self, a: dict[str, np.ndarray] | None) -> None:
        """B back to zero, A to `a` (or kept), the optimizer's state forgotten."""
        self.pairs = {
            name: (mx.array(a[name]) if a is not None else a_m, mx.zeros(b_m.shape))
            for name, (a_m, b_m) in self.pairs.items()
        }
        self.steps = 0
        self.first: dict | None = None  # Adam's first moments, or SGD's momentum
        self.second: dict | None = None

    def step(self, grads: dict) -> None:
        cfg = self.cfg
        lr, wd, b1, b2 = cfg.ttt_lora_lr, cfg.ttt_weight_decay, cfg.ttt_beta1, cfg.ttt_beta2
        self.steps += 1
        zeros = {k: (mx.zeros(a.shape), mx.zeros(b.shape)) for k, (a, b) in self.pairs.items()}
        first, second = self.first or zeros, self.second or zeros
        pairs, new_first, new_second = {}, {}, {}
        for k, pair in self.pairs.items():
            out, m_out, v_out = [], [], []
            for p, g, m, v in zip(pair, grads[k], first[k], second[k], strict=True):
                if cfg.ttt_optimizer == "sgd":
                    g = g + wd * p
                    m = g if self.first is None else b1 * m + g
                    p = p - lr * m
                else:
                    p = p * (1.0 - lr * wd)
                    m = b1 * m + (1.0 - b1) * g
                    v = b2 * v + (1.0 - b2) * g * g
                    denom = mx.sqrt(v) / math.sqrt(1.0 - b2**self.steps) + 1e-10
                    p = p - (lr / (1.0 - b1**self.steps)) * m / denom
                out.append(p)
                m_out.append(m)
                v_out.append(v)
            pairs[k], new_first[k], new_second[k] = tuple(out), tuple(m_out), tuple(v_out)
        self.pairs, self.first, self.second = pairs, new_first, new_second
        mx.eval(self.pairs, self.first, self.second)
