"""The MLX backend: what core.train.loop needs to train pgolf's GPT on Apple silicon (or a CPU).

A step accumulates gradients over the micro-batches, each cut into sub-batches of
at most `mlx_max_microbatch_tokens` tokens so a 16 GB Mac does not run out of
memory, then applies one optimizer update. On the GPU both the gradient of a
sub-batch and the update are `mx.compile`d; the learning-rate multiplier and the
momentum enter as arrays, so changing them does not recompile. On a CPU `compile`
defaults to off: measured there, it was no faster and it undid the memory saving
of the CPU ops (mlx_train/ops.py), most likely by merging their backward-pass
recomputations with the forward pass.

Several processes (or Macs) train together through MLX's own `mx.distributed`,
started by `mlx.launch` (see docs/distributed.md): each rank reads its own share of every
batch, the gradients are averaged with one `all_sum` per tensor, and every rank
then applies the same update (Muon's orthogonalisation is computed on every rank).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from core.common.errors import PgolfError
from core.config.fields import Config
from core.model.backend import text_by_sum
from core.model.lora import adapter_shapes
from core.model.params import check_layout, head_weight_name, param_specs, storage_dtypes
from mlx_train.model import GPT, CastedLinear
from mlx_train.optim import Optimizers

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


def _on_gpu() -> bool:
    return mx.default_device() == mx.gpu


def check_config(cfg: Config) -> None:
    """The options only MLX reads."""
    if cfg.mlx_max_microbatch_tokens <= 0:
        raise PgolfError(
            f"config: mlx_max_microbatch_tokens must be positive, got {cfg.mlx_max_microbatch_tokens}"
        )


def sub_batches(x: np.ndarray, y: np.ndarray, max_tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Split (B, T) batches into runs of whole sequences of at most max_tokens tokens (one sequence at least)."""
    per = max(max_tokens // x.shape[1], 1)
    return [(x[i : i + per], y[i : i + per]) for i in range(0, x.shape[0], per)]


class MLXBackend:
    name = "mlx"

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.specs = param_specs(cfg)
        self.group = mx.distributed.init()  # a group of one unless started by mlx.launch
        self.rank, self.world_size = self.group.rank(), self.group.size()
        gpu = _on_gpu()
        self.bf16 = cfg.uses_bf16(gpu)
        self.device = f"gpu ({mx.device_info().get('device_name', 'Apple GPU')})" if gpu else "cpu"
        self.peak_flops = None
        self.dtypes = {k: DTYPES[v] for k, v in storage_dtypes(cfg, self.bf16).items()}
        self.model = GPT(cfg, mx.bfloat16 if self.bf16 else mx.float32)
        shapes = {k: tuple(v.shape) for k, v in tree_flatten(self.model.parameters())}
        check_layout(cfg, shapes, "the MLX model")
        self.optim = Optimizers(cfg, self.specs)
        compile_on = cfg.uses_compile(gpu)
        # A keyword argument of the compiled functions below: mx.compile keeps one trace per value
        # (passed positionally, MLX 0.32 traces a first False twice).
        self.looping = cfg.num_loops > 0
        self._counters: dict[str, int] = {}  # counter_add's

        grad_fn = nn.value_and_grad(self.model, self.model.loss)
        # value_and_grad swaps traced parameters into the model, so its state is an output too.
        model_state = [self.model.state]
        self._grad = (
            partial(mx.compile, inputs=model_state, outputs=model_state)(grad_fn) if compile_on else grad_fn
        )

        def update(grads: dict, lr_mult: mx.array, momentum: mx.array, muon_wd_mult: mx.array) -> None:
            params = dict(tree_flatten(self.model.parameters()))
            if cfg.grad_clip_norm > 0:
                norm = mx.sqrt(sum(mx.sum(g.astype(mx.float32) ** 2) for g in grads.values()))
                factor = mx.minimum(cfg.grad_clip_norm / (norm + 1e-6), 1.0)
                grads = {k: g * factor for k, g in grads.items()}
            self.model.update(
                tree_unflatten(list(self.optim.apply(params, grads, lr_mult, momentum, muon_wd_mult).items()))
            )

        state = [self.model.state, self.optim.state]
        self._update = partial(mx.compile, inputs=state, outputs=state)(update) if compile_on else update

        # float64 exists on the CPU only: on a Metal GPU the sums stay float32.
        self.sum_dtype = mx.float32 if _on_gpu() else mx.float64

        def nll_sum(x: mx.array, y: mx.array, looping: bool) -> mx.array:
            return self.model.token_losses(x, y, looping).astype(self.sum_dtype).sum()

        self._nll_sum = mx.compile(nll_sum, inputs=self.model.state) if compile_on else nll_sum

        def token_losses(x: mx.array, y: mx.array, looping: bool) -> mx.array:
            return self.model.token_losses(x, y, looping).astype(mx.float32)

        self._token_losses = mx.compile(token_losses, inputs=self.model.state) if compile_on else token_losses

    # ------------------------------------------------------------------ state
    def load_params(self, params: dict[str, np.ndarray]) -> None:
        check_layout(self.cfg, {k: np.shape(v) for k, v in params.items()}, "weights")
        arrays = [
            (k, mx.array(np.asarray(params[k], dtype=np.float32)).astype(self.dtypes[k])) for k in self.specs
        ]
        self.model.update(tree_unflatten(arrays))
        self.optim.reset_ema(dict(arrays))
        mx.eval(self.model.parameters(), self.optim.state)

    def params(self) -> dict[str, np.ndarray]:
        flat = dict(tree_flatten(self.model.parameters()))
        return {k: np.array(flat[k].astype(mx.float32)) for k in self.specs}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in self.optim.state.items()}

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        for key, current in list(self.optim.state.items()):
            value = state.get(key)
            if value is None:
                raise PgolfError(f"optimizer state lacks {key}")
            self.optim.state[key] = mx.array(np.asarray(value)).astype(current.dtype).reshape(current.shape)
        mx.eval(self.optim.state)

    # --------------------------------------------------------------- compute
    def train_step(
        self,
        micro_batches: list[tuple[np.ndarray, np.ndarray]],
        lr_mult: float,
        muon_momentum: float,
        muon_wd_mult: float = 1.0,
    ) -> mx.array:
        total = sum(x.size for x, _ in micro_batches)
        grads: dict[str, mx.array] | None = None
        loss = mx.array(0.0, dtype=mx.float32)
        for mx_, my_ in micro_batches:
            for x, y in sub_batches(mx_, my_, self.cfg.mlx_max_microbatch_tokens):
                weight = x.size / total  # sub-batch share of the step's tokens
                value, tree = self._grad(mx.array(x), mx.array(y), looping=self.looping)
                flat = dict(tree_flatten(tree))
                if grads is None:
                    grads = {k: g * weight for k, g in flat.items()}
                else:
                    grads = {k: grads[k] + g * weight for k, g in flat.items()}
                loss = loss + value * weight
                if self.cfg.mlx_eager_eval:
                    mx.eval(grads, loss)  # keep the lazy graph from growing across sub-batches
        assert grads is not None, "train_step needs at least one micro-batch"
        if self.world_size > 1:
            grads = {
                k: mx.distributed.all_sum(g, group=self.group) / self.world_size for k, g in grads.items()
            }
        self._update(
            grads,
            mx.array(lr_mult, dtype=mx.float32),
            mx.array(muon_momentum, dtype=mx.float32),
            mx.array(muon_wd_mult, dtype=mx.float32),
        )
        mx.eval(self.model.state, self.optim.state, loss)
        return loss

    def set_looping(self, active: bool) -> None:
        self.looping = bool(active) and self.cfg.num_loops > 0

    def eval_nll(self, x: np.ndarray, y: np.ndarray) -> mx.array:
        total = mx.array(0.0, dtype=self.sum_dtype)
        for xs, ys in sub_batches(x, y, self.cfg.mlx_max_microbatch_tokens):
            total = total + self._nll_sum(mx.array(xs), mx.array(ys), looping=self.looping)
        mx.async_eval(total)  # started, not waited for; and the caller's lazy sum stays short
        return total

    def segments_every(self, length: int) -> AbstractContextManager[None]:
        return self.model.walk.segments_every(length)

    def token_losses(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        parts = [
            np.array(self._token_losses(mx.array(xs), mx.array(ys), looping=self.looping))
            for xs, ys in sub_batches(x, y, self.cfg.mlx_max_microbatch_tokens)
        ]
        return np.concatenate(parts)

    def input_hessians(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        sums: dict[str, mx.array] = {}

        def add(name: str, x: mx.array) -> None:
            x = x.astype(mx.float32).reshape(-1, x.shape[-1])
            gram = x.T @ x
            sums[name] = sums[name] + gram if name in sums else gram

        linears = [
            (prefix, module)
            for prefix, module in self.model.named_modules()
            if isinstance(module, CastedLinear) and prefix != "lm_head"
        ]
        for prefix, module in linears:
            module.on_input = partial(add, f"{prefix}.weight")
        head = head_weight_name(self.cfg)
        try:
            for x, y in batches:
                for xs, _ in sub_batches(x, y, self.cfg.mlx_max_microbatch_tokens):
                    add(head, self.model.hidden(mx.array(xs), self.looping))
                    mx.eval(sums)
        finally:
            for _, module in linears:
                module.on_input = None
        return {name: np.array(h) for name, h in sums.items()}

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.array(self.model.logits(mx.array(x), self.looping).astype(mx.float32))

    def decoder(self) -> Callable[[np.ndarray], np.ndarray]:
        model, cache = self.model, {}

        def next_logits(ids: np.ndarray) -> np.ndarray:
            logits = model.decode(mx.array(ids[None]), cache, self.looping)
            return np.array(logits[0, -1].astype(mx.float32))

        return next_logits

    # ----------------------------------------------------- test-time training
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
        xs, ys = mx.array(x), mx.array(y)
        steps = self.cfg.ttt_grad_steps if train_rows.any() else 0
        if steps == 0:
            return np.array(self.model.token_losses(xs, ys, self.looping, adapters.pairs).astype(mx.float32))
        rows = mx.array(np.asarray(train_rows, dtype=np.float32))

        def loss(pairs: dict, xs: mx.array, ys: mx.array) -> tuple[mx.array, mx.array]:
            nll = self.model.token_losses(xs, ys, self.looping, pairs)
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
        params = {
            k: p for k, p in tree_flatten(self.model.parameters()) if not k.startswith(self._sgd_frozen)
        }
        if x.shape[0]:

            def loss(xs: mx.array, ys: mx.array) -> mx.array:
                return self.model.token_losses(xs, ys, self.looping).sum() / total_tokens

            with self.model.walk.plain_causal(not doc_mask):
                _, tree = nn.value_and_grad(self.model, loss)(mx.array(x), mx.array(y))
            grads = {k: g.astype(mx.float32) for k, g in tree_flatten(tree) if k in params}
        else:
            grads = {k: mx.zeros(p.shape, dtype=mx.float32) for k, p in params.items()}
        if self.world_size > 1:
            grads = {k: mx.distributed.all_sum(g, group=self.group) for k, g in grads.items()}
        if clip > 0:
            norm = mx.sqrt(sum(mx.sum(g * g) for g in grads.values()))
            grads = {k: g * mx.minimum(clip / (norm + 1e-6), 1.0) for k, g in grads.items()}
        new = []
        for k, g in grads.items():
            buf = self._sgd_buffers.get(k)
            buf = g if buf is None else self._sgd_momentum * buf + g
            self._sgd_buffers[k] = buf
            new.append((k, (params[k].astype(mx.float32) - lr * buf).astype(params[k].dtype)))
        self.model.update(tree_unflatten(new))
        mx.eval(self.model.parameters(), self._sgd_buffers)

    def counter_add(self, key: str, amount: int) -> int:
        # No store is shared between MLX processes: the ranks take turns instead (rank r gets every
        # world_size-th value), which is the same as sharing a counter when each call adds 1.
        calls = self._counters[key] = self._counters.get(key, 0) + 1
        if amount != 1 and self.world_size > 1:
            raise PgolfError("MLX ranks share a counter only one at a time")
        return (calls - 1) * self.world_size * amount + (self.rank + 1) * amount

    # ------------------------------------------------------------ plumbing
    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if self.world_size == 1:
            return values
        # float64 exists on the CPU stream only; the sums (bytes, nats) need its precision.
        return np.array(mx.distributed.all_sum(mx.array(values), group=self.group, stream=mx.cpu))

    def from_rank_0(self, key: str, text: str | None, wait_seconds: float) -> str:
        if self.world_size == 1:
            return text or ""
        # No store is shared between MLX processes; its collectives wait without a timeout.
        return text_by_sum(self.all_reduce_sum, self.rank, text)

    def synchronize(self) -> None:
        mx.synchronize()

    def peak_memory_bytes(self) -> int | None:
        return int(mx.get_peak_memory())  # Metal or CPU allocator: MLX tracks both

    def close(self, failed: bool = False) -> int | None:
        return None  # mx.distributed keeps nothing to release; it cannot tell who failed first


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


def create_backend(cfg: Config) -> MLXBackend:
    return MLXBackend(cfg)
